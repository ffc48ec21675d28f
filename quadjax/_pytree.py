"""A frozen dataclass whose every field is a pytree leaf (no dependency beyond JAX)."""

import dataclasses

import jax


def pytree_dataclass(cls):
    """Make ``cls`` a frozen dataclass registered with JAX, all fields as data.

    Structure (number of rotors, options that change the computation) lives in
    the array shapes or in static arguments, so vmap, grad and optax see every field
    as a leaf; the exception is a field declared ``dataclasses.field(metadata={"static":
    True})`` (engine hooks' options), which is structure.
    """
    cls = dataclasses.dataclass(frozen=True)(cls)
    if "replace" not in cls.__dict__:
        cls.replace = _replace
    fields = dataclasses.fields(cls)
    # a field declared with metadata={"static": True} is structure (hashable), not a leaf
    static = [f.name for f in fields if f.metadata.get("static")]
    data = [f.name for f in fields if not f.metadata.get("static")]
    jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=static)
    return cls


def _replace(self, **changes):
    """A copy with some fields replaced (unchecked: fine inside traced code)."""
    return dataclasses.replace(self, **changes)
