"""The root of Parrot's one exception hierarchy: every error a client can cause carries its
HTTP status and a stable ``code``.

It lives in the wire contract because the template grammar (:mod:`parrot.wire.template`),
which the client checks before it sends and the server checks when it receives, raises one;
the server's own errors (:mod:`parrot.engines.protocol.errors`,
:mod:`parrot.platform.serve.errors`) extend these classes, and
:mod:`parrot.engines.protocol.error_responses` turns any of them into a JSON response in one place.
"""


class ParrotError(Exception):
    """Base of all Parrot errors. ``str(error)`` is the message shown to the client."""

    status_code = 500
    code = "internal_error"


class BadRequestError(ParrotError):
    status_code = 400
    code = "bad_request"


class NotFoundError(ParrotError):
    status_code = 404
    code = "not_found"


class ConflictError(ParrotError):
    status_code = 409
    code = "conflict"
