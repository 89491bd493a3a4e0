"""What a sink write can fail with, and whether trying again can help."""

from __future__ import annotations


class SinkError(Exception):
    """A sink failure; the message is one line for the user. Unclassified failures
    (an error the database reports that none of the classes below covers) are
    retryable."""

    retryable = True


class SinkRejected(SinkError):
    """The write can never succeed as given: a row that does not fit its table (a
    bad type, a missing key column), a column whose type cannot change so, an
    identifier that is not one, a table the sink may not write (a block database
    table) or whose name is taken, or a statement the database refuses as such (too
    many columns, a duplicate name)."""

    retryable = False


class SinkMismatch(SinkRejected):
    """The writer was told to write another sink than this one (their identities
    differ): nothing is written."""


class SinkUnavailable(SinkError):
    """The database cannot be reached now, or a lock was not granted in time."""

    retryable = True
