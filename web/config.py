"""Settings of the dashboard (``parrot serve --dashboard-auth``, ``--no-dashboard``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DashboardConfig:
    """``require_sign_in``: the read-only pages need signing in too (by default they are
    open to clients on the loopback interface, and need signing in from anywhere else).
    Admin actions always need signing in with the admin token. ``secure_cookies``: mark
    the session and CSRF cookies ``Secure`` (behind HTTPS). ``live_interval_s``: the
    least time between two live updates of a page."""

    enabled: bool = True
    require_sign_in: bool = False
    secure_cookies: bool = False
    live_interval_s: float = 1.0
    live_max_s: float = 600.0  # a live stream ends after this; the browser reconnects
    sign_in_max_age_s: int = 12 * 3600

    def __post_init__(self) -> None:
        if not 0.2 <= self.live_interval_s <= 60:
            raise ValueError(f"live_interval_s must be within [0.2, 60], got {self.live_interval_s}")
        if self.live_max_s <= 0 or self.sign_in_max_age_s <= 0:
            raise ValueError("live_max_s and sign_in_max_age_s must be positive")
