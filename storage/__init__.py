"""The artifact store: names, versions, atomic publish, the catalog, Parquet I/O (local or fsspec)."""

from storage.catalog import Catalog
from storage.store import ArtifactRef, ArtifactStore, ArtifactWriter, StoreError, content_version

__all__ = ["ArtifactRef", "ArtifactStore", "ArtifactWriter", "Catalog", "StoreError", "content_version"]
