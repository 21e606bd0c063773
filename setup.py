"""Packages: everything installs under one `lexiflow` package. The subpackages stay at the top of
the repository and are mapped with `package_dir`; their own subpackages are found, not listed."""

from setuptools import find_packages, setup

SUBPACKAGES = ("models", "storage", "tasks", "flows", "deployments")

setup(
    packages=["lexiflow", *(f"lexiflow.{name}" for top in SUBPACKAGES
                            for name in (top, *(f"{top}.{sub}" for sub in find_packages(top))))],
    package_dir={"lexiflow": "lexiflow", **{f"lexiflow.{top}": top for top in SUBPACKAGES}},
)
