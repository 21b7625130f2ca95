"""The contexts the ServeCore holds on its engines, and their one owner."""
