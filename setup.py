"""Maps the top-level code folders onto the ``parrot.*`` namespace.

``platform/`` deliberately has no ``__init__.py`` (a ``platform`` package would shadow the
standard library) and is a namespace portion; the other folders may be regular packages.
The package list is built here by walking the folders, which covers both. ``migrations/``
(Alembic's environment) goes along as ``parrot/migrations``, where the store looks for it
beside ``parrot/platform`` in an installed (not editable) server.
"""

import os

from setuptools import setup

ROOTS = ("platform", "engines", "sdk", "adapters", "web", "wire", "cli", "migrations")


def _packages() -> list[str]:
    found = []
    for root in ROOTS:
        for dirpath, dirnames, _files in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            found.append("parrot." + dirpath.replace(os.sep, "."))
    return found


setup(
    packages=_packages(),
    package_dir={f"parrot.{root}": root for root in ROOTS},
    package_data={"": ["*.html", "*.js", "*.css", "*.txt", "*.json", "*.ini", "*.mako", "*.cpp", "*.h"]},
    include_package_data=True,
)
