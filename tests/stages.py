"""Publish one stage's artifact without Prefect, for tests that build a small store by hand."""

from __future__ import annotations

from lexiflow.storage import ArtifactRef, ArtifactStore


def publish(store: ArtifactStore, stage, **arguments) -> ArtifactRef:
    """The builder the task wraps, with the version, inputs and parameters the task would record;
    a version already in the store is reused, as the task would."""
    inputs, params, version = stage.describe({"store": store.url, **arguments})
    if not store.exists(stage.name, version):
        with store.writer(stage.name, version, inputs=inputs, parameters=params) as out:
            stage.fn.__wrapped__(out, **arguments)
    return store.ref(stage.name, version)
