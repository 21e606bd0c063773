"""The artifact store: names, versions, atomic publish, the catalog, Parquet I/O (local or fsspec)."""

import fsspec
from lexiflow.storage.catalog import Catalog
from lexiflow.storage.manifests import StoreError, content_version
from lexiflow.storage.store import ArtifactRef, ArtifactStore
from lexiflow.storage.writer import ArtifactWriter

# `flaky://` (fault injection for tests, storage/faults.py), imported only when a URL uses it.
fsspec.register_implementation("flaky", "lexiflow.storage.faults.FlakyFileSystem", clobber=True)

__all__ = ["ArtifactRef", "ArtifactStore", "ArtifactWriter", "Catalog", "StoreError", "content_version"]
