"""Address options checked where they are parsed: a malformed one is a usage error.

A ``host:port`` the client cannot dial would otherwise travel to the first RPC and
come back as a service error (exit 3), as if the cluster were down. Each callback
here turns it into one line naming the option (or the environment variable the
value came from) and exit 2, before any command runs.
"""

from __future__ import annotations

from typing import Final

import typer

from blockx_cli.output import EXIT_USAGE, fail

# ``blockx_core.addr`` is imported where a value is checked: ``blockx --version``
# and a command whose address options are not given never load ``blockx_core``.

_UNIX_PREFIXES: Final = ("unix://", "unix:")


def _where(ctx: typer.Context, param: typer.CallbackParam) -> str:
    """Where the value came from: the ``--flag``, or the environment variable."""
    name = param.name or ""
    source = ctx.get_parameter_source(name)
    if source is not None and source.name == "ENVIRONMENT" and isinstance(param.envvar, str):
        return param.envvar
    return param.opts[0] if param.opts else name


def dial_address(text: str) -> str:
    """A ``host:port`` (or ``[v6]:port``) a client can dial, or InvalidAddress."""
    from blockx_core.addr import InvalidAddress, split_host_port

    _, port = split_host_port(text.strip())
    if port == 0:
        raise InvalidAddress(f"{text!r} has port 0, which cannot be dialled")
    return text.strip()


def etcd_endpoint(text: str) -> str:
    """An etcd endpoint as the servers accept it: ``host:port``, ``[v6]:port`` or a
    bare host (port 2379), an ``http://`` or ``https://`` scheme allowed (TLS comes
    from ``--etcd-ca-file``). Returned as ``host:port``."""
    from blockx_core.addr import etcd_host_port

    return dial_address(etcd_host_port(text))


def unix_socket_path(text: str) -> str:
    """A Unix socket path, written plainly or as ``unix:PATH`` / ``unix://PATH``
    (the form ``blockx dev up`` prints)."""
    from blockx_core.addr import InvalidAddress

    path = text.strip()
    for prefix in _UNIX_PREFIXES:
        if path.startswith(prefix):
            path = path[len(prefix) :]
            break
    if not path:
        raise InvalidAddress(f"{text!r} names no socket path")
    return path


def host_port_option(
    ctx: typer.Context, param: typer.CallbackParam, value: str | None
) -> str | None:
    """Typer callback: a dialable ``host:port``, or usage error."""
    if value is None or ctx.resilient_parsing:
        return value
    from blockx_core.addr import InvalidAddress

    try:
        return dial_address(value)
    except InvalidAddress as exc:
        fail(
            f"{_where(ctx, param)}: {exc}",
            EXIT_USAGE,
            hint="write host:port, e.g. 127.0.0.1:8080 or [::1]:8080",
        )


def etcd_endpoints_option(
    ctx: typer.Context, param: typer.CallbackParam, value: str | None
) -> str | None:
    """Typer callback: comma-separated etcd endpoints, each checked, or usage error;
    None (not given) is left for the settings' later layers."""
    if ctx.resilient_parsing or value is None:
        return value
    from blockx_core.addr import InvalidAddress

    try:
        endpoints = [etcd_endpoint(e) for e in value.split(",") if e.strip()]
    except InvalidAddress as exc:
        fail(
            f"{_where(ctx, param)}: {exc}",
            EXIT_USAGE,
            hint="write host:port[,host:port...], e.g. localhost:2379",
        )
    if not endpoints:
        fail(f"{_where(ctx, param)}: {value!r} names no etcd endpoint", EXIT_USAGE)
    return ",".join(endpoints)


def unix_socket_option(
    ctx: typer.Context, param: typer.CallbackParam, value: str | None
) -> str | None:
    """Typer callback: a Unix socket path (``unix:`` prefix allowed), or usage error."""
    if value is None or ctx.resilient_parsing:
        return value
    from blockx_core.addr import InvalidAddress

    try:
        return unix_socket_path(value)
    except InvalidAddress as exc:
        fail(f"{_where(ctx, param)}: {exc}", EXIT_USAGE)
