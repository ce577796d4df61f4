"""Verification: symbolic replay of an Algorithm against its collective, and race detection.

``verify_algorithm`` returns a report of every violation; ``check_algorithm`` raises
``VerificationError`` with them. ``races`` finds conflicting accesses that no happens-before
order separates.
"""

from __future__ import annotations

from taccl_py.verify.replay import (
    VerificationReport,
    check_algorithm,
    describe_value,
    exported_inplace_form,
    verify_algorithm,
)

__all__ = ["VerificationReport", "check_algorithm", "describe_value", "exported_inplace_form", "verify_algorithm"]
