"""What the submission rules accept but a person should know (R-13, R-14, R-04).

The model and the stable codes are the domain's (`runyard.domain.warnings`: the
launch command checks live there too, so the gateway's console can show them
before a submission); re-exported here for the rules.
"""

from __future__ import annotations

from runyard.domain.warnings import SubmissionWarning, WarningCode

__all__ = ["SubmissionWarning", "WarningCode"]
