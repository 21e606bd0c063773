"""Publish one stage's artifact without Prefect, for tests that build a small store by hand."""

from __future__ import annotations

from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.tasks.code_versions import code_version


def publish(store: ArtifactStore, stage, **arguments) -> ArtifactRef:
    """The builder the task wraps, with the version, inputs and parameters the task would record;
    a version already in the store is reused, as the task would."""
    inputs, params, version = stage.describe({"store": store.url, **arguments})
    if not store.exists(stage.name, version):
        with store.writer(stage.name, version, inputs=inputs, parameters=params) as out:
            out.store_url, out.version = store.url, version  # as the task sets them (its pieces: tasks/pieces.py)
            out.code_version = code_version(stage.code_modules({"store": store.url, **arguments}))
            stage.fn.__wrapped__(out, **arguments)
    return store.ref(stage.name, version)
