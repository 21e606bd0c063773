"""An example downstream job: export the released embeddings and tokenizer to a serving folder.

`lexiflow serve` deploys it as `serve-release` with a deployment trigger on the `lexiflow.artifact.released`
event of `embeddings@production` in its store (deployments/definitions.py), so each release that moves the
embeddings starts it; it also runs by hand. It reads the artifacts by alias, never "the latest": what a
failed rebuild published is never served. docs/operations.md shows how to write one's own.

Layout of the serving folder: `<folder>/<kind>/<version>/` (an export: `lexiflow artifacts export`) and
`<folder>/<kind>/current`, a symbolic link to the version served, replaced in one step (a reader sees the
old version or the new one, never a mix).
"""

from __future__ import annotations

import os
from pathlib import Path

from lexiflow.loaders import EXPORT_EXTRAS
from lexiflow.storage import Catalog, StoreError
from lexiflow.storage.export import export
from prefect import flow, get_run_logger

SERVED_KINDS = ("embeddings", "tokenizer")


@flow(name="serve-release", log_prints=True)
def serve_release(store: str = "artifacts", folder: str = "serving", alias: str = "production") -> dict[str, str]:
    """Export the released embeddings and tokenizer (KIND@ALIAS) into a serving folder and point
    `<folder>/<kind>/current` at them.

    Args:
        store: Artifact store (a folder or an fsspec URL).
        folder: The serving folder (local).
        alias: The alias to serve.
    """
    catalog, served = Catalog(store), {}
    for kind in SERVED_KINDS:
        version = catalog.released(kind, alias)
        if version is None:
            raise StoreError(f"nothing is released as {kind}@{alias} in {store}: release a version first "
                             f"(lexiflow release {kind}:VERSION --as {alias})")
        target = Path(folder) / kind / version
        if not target.exists():  # an export is never changed: a version exported once is served as it is
            export(catalog, kind, version, target, EXPORT_EXTRAS)
        link = target.parent / "current"
        temporary = target.parent / f".current-{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(version)
        os.replace(temporary, link)  # atomic: readers of `current` see one version or the other
        served[kind] = version
        get_run_logger().info("serving %s@%s = %s at %s", kind, alias, version, link)
    return served
