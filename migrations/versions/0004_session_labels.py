"""Session labels (issue 38): a session may carry a label and tags that its client gave it,
to be found by on the dashboard; NULL for sessions made without them (every session
stored before this revision).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("label", sa.String(200), nullable=True))
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("tags")
        batch.drop_column("label")
