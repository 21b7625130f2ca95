"""The ServeCore's SQL store (SQLAlchemy 2 async; SQLite by default, any URL allowed)."""
