"""SDK tests. A package (unlike the other test folders) so that its conftest.py gets its own
module name and does not replace the root ``conftest`` that test modules import from."""
