"""The table of kinds lives in ``waypost.kind_table``; this name stays for the kinds' packages that still
import it from here."""

from ..kind_table import KINDS, SCHEMES, RegistryKind, Words, all_kinds, kind_of, lookup, part, register_kind

__all__ = ["KINDS", "SCHEMES", "RegistryKind", "Words", "all_kinds", "kind_of", "lookup", "part", "register_kind"]
