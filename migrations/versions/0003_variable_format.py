"""Typed semantic variables (issue 21): a variable may carry its output format (a JSON
schema, a JSON object, a regex, a choice or a grammar), as the JSON of ``OutputFormat``;
NULL for untyped variables (every variable stored before this revision).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("semantic_vars") as batch:
        batch.add_column(sa.Column("format", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("semantic_vars") as batch:
        batch.drop_column("format")
