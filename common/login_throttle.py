"""Login throttling (django-axes) per username and address, and per address across usernames.

Axes counts failed logins per (username, address) (settings.AXES_LOCKOUT_PARAMETERS):
after AXES_FAILURE_LIMIT failures that pair is locked out. Alone, that never
slows an address that tries a few passwords on each of many usernames
(password spraying). This handler also locks an address out, for every
username, once it has failed to log in as AXES_USERNAMES_PER_ADDRESS distinct
usernames within the cool-off (AXES_COOLOFF_TIME).

Why not axes' own `["ip_address", ["username", "ip_address"]]`: it counts an
address's failures against the same limit as one username's (five typos
across an office behind one NAT would lock the office out), and a successful
login resets every count its parameters match, the address's included, so a
sprayer with one account of its own could clear its count between rounds. Here
a success resets only its own (username, address) pair, as before; the
usernames the address failed on stay counted until the cool-off ends.
"""

from __future__ import annotations

from axes.handlers.database import AxesDatabaseHandler
from axes.attempts import get_cool_off_threshold
from axes.helpers import get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings


class LoginThrottleHandler(AxesDatabaseHandler):
    """settings.AXES_HANDLER: axes' database handler plus the per-address limit across usernames."""

    def get_failures(self, request, credentials: dict | None = None) -> int:
        failures = super().get_failures(request, credentials)
        limit = int(getattr(settings, "AXES_USERNAMES_PER_ADDRESS", 0) or 0)
        address = getattr(request, "axes_ip_address", None)
        if limit and address and self.usernames_failed(request) >= limit:
            return max(failures, get_failure_limit(request, credentials))
        return failures

    @staticmethod
    def usernames_failed(request) -> int:
        """Distinct usernames with failed logins from the request's address within the cool-off."""
        attempts = AccessAttempt.objects.filter(ip_address=request.axes_ip_address)
        if settings.AXES_COOLOFF_TIME is not None:
            attempts = attempts.filter(attempt_time__gte=get_cool_off_threshold(request))
        return attempts.values("username").distinct().count()
