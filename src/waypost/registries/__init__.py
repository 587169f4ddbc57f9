"""The registry kinds, one package each: everything a kind needs (its URL grammar and
settings, its client, its registration, its resolver, its console source) in one place. Each package's ``kind``
module declares its ``RegistryKind``; ``kind_table.py`` loads them by name when a scheme is first looked up,
the same way as third-party kinds (docs/registry-kinds.md). Nothing outside a kind's package imports it.
"""
