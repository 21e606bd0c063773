"""The artifact store: names, versions, atomic publish, the catalog, Parquet I/O (local or fsspec)."""

import fsspec

from storage.catalog import Catalog
from storage.store import ArtifactRef, ArtifactStore, ArtifactWriter, StoreError, content_version

# `flaky://` (fault injection for tests, storage/faults.py), imported only when a URL uses it.
fsspec.register_implementation("flaky", "storage.faults.FlakyFileSystem", clobber=True)

__all__ = ["ArtifactRef", "ArtifactStore", "ArtifactWriter", "Catalog", "StoreError", "content_version"]
