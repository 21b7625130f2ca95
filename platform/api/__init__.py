"""The Parrot REST API (Litestar): thin controllers over the ServeCore."""
