"""ServeCore state: small named facts about the ServeCore's runs (the context-id regions
of its earlier runs, so a restart frees the contexts a killed run left on engines).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "servecore_state",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("servecore_state")
