"""A frozen dataclass whose every field is a pytree leaf (no dependency beyond JAX)."""

import dataclasses

import jax


def pytree_dataclass(cls):
    """Make ``cls`` a frozen dataclass registered with JAX, all fields as data.

    Structure (number of rotors, options that change the computation) lives in
    the array shapes or in static arguments, never in a field, so vmap, grad and
    optax see every field as a leaf.
    """
    cls = dataclasses.dataclass(frozen=True)(cls)
    if "replace" not in cls.__dict__:
        cls.replace = _replace
    names = [f.name for f in dataclasses.fields(cls)]
    jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])
    return cls


def _replace(self, **changes):
    """A copy with some fields replaced (unchecked: fine inside traced code)."""
    return dataclasses.replace(self, **changes)
