"""`--config FILE` of run, sweep and capacity: a TOML file of option values, or a
run's run.json (its recorded config), as the command's defaults; flags typed beside
it win. docs/replaying.md, "Config files"."""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from replayer.cli.errors import CommandError
from replayer.cli.params import ShellArgs

F = TypeVar("F", bound=Callable[..., Any])

# Keys a file never sets: the API key is a secret (it comes from the environment),
# and the file does not name another file.
_REFUSED = {"api_key", "config"}

# run.json's config → the options that set it: (field, option key); an option key
# starting with "!" takes the negated value (vllm_extras → --no-vllm-extras).
_TOP = {
    "think_scale": "think-scale",
    "think_cap_s": "think-cap",
    "tool_scale": "tool-scale",
    "warmup_s": "warmup",
    "duration_s": "duration",
    "drain": "drain",
    "loop": "loop",
    "seed": "seed",
    "max_inflight": "max-inflight",
    "workers": "workers",
    "ray_address": "ray",
    "ray_workers": "ray-workers",
    "profile": "profile",
    "cache_warmup_s": "cache-warmup",
    "idle_skip_s": "idle-skip",
    "on_error": "on-error",
    "session_header": "session-header",
    "session_id_scope": "session-id-scope",
    "session_routing": "session-routing",
    "agent_native": "agent-native",
    "output_scale": "output-scale",
    "max_output_tokens": "max-output-tokens",
    "fit_context": "fit-context",
    "mooncake_rows": "mooncake-rows",
    "max_error_rate": "max-error-rate",  # in older runs' config; now the CLI's alone
    "live_assistant": "live-assistant",
    "virtual": "virtual",
    "sim_args": "sim-args",
}
_ENDPOINT = {
    "base_url": "endpoint",
    "model": "model",
    "api": "api",
    "connect_timeout_s": "connect-timeout",
    "read_timeout_s": "read-timeout",
    "total_timeout_s": "request-timeout",
    "vllm_extras": "!no-vllm-extras",
    "keepalive": "!no-keepalive",
    "session_token_header": "session-token-header",
}
_PROMPT = {
    "block_tokens": "block-tokens",
    "max_input_tokens": "max-input-tokens",
    "tokenizer": "tokenizer",
    "replay_markers": "replay-markers",
}
_LABELS = {
    "engine": "engine",
    "engine_version": "engine-version",
    "tp": "tp",
    "ep": "ep",
    "gpus": "gpus",
    "hardware": "hardware",
    "precision": "precision",
    "pp": "pp",
    "disagg": "disagg",
    "kv_offload": "kv-offload",
    "spec_decode": "spec-decode",
    "router": "router",
}
# Recorded, but no option sets them (the runner's own intervals, whether a key was
# set, the prompt's API, which is the endpoint's), or read apart below.
_TOP_OTHERS = {
    "flush_interval_s",
    "scrape_interval_s",
    "schedule",
    "endpoint",
    "prompt",
    "labels",
    "start_ratio",
    "max_model_len",  # the server's, read at the start
}
_ENDPOINT_OTHERS = {"include_usage", "api_key_set"}
_PROMPT_OTHERS = {"api", "salt", "token_min", "token_max", "cache_bytes"}


def config_option(f: F) -> F:
    """``--config FILE``: read before the other options, its values become their
    defaults (so a flag typed beside it wins, and ``--profile`` fills only what
    neither sets)."""
    return click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, path_type=Path),
        is_eager=True,
        expose_value=False,
        callback=_load,
        metavar="FILE",
        help="Option values from a TOML file (the flags' names as keys, e.g. "
        "concurrency = 8, think-scale = 0.5) or a run's run.json (its recorded "
        "config, to replay it again); flags given beside it win. Never an API key.",
    )(f)


def _load(ctx: click.Context, _param: click.Parameter, path: Path | None) -> None:
    if path is None:
        return
    entries, recorded = _read(path)
    options = _options_by_key(ctx.command)
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}  # option name → the key that set it
    for key, value, shown in entries:
        norm = key.replace("-", "_")
        if norm in _REFUSED:
            what = "an API key" if norm == "api_key" else "another config file"
            raise CommandError(
                f"{path}: {shown!r}: {what} is never read from a config file"
                + (
                    " (put it in $OPENAI_API_KEY, or name its variable with "
                    "api-key-env)"
                    if norm == "api_key"
                    else ""
                )
            )
        found = options.get(norm)
        if found is None:
            if recorded:  # a recorded value this command sets otherwise (its levels)
                continue
            raise CommandError(
                f"{path}: unknown key {shown!r}"
                + _hint(norm, options, ctx.command_path)
            )
        option, negated = found
        name = str(option.name)
        if name in keys:
            raise CommandError(
                f"{path}: {keys[name]!r} and {shown!r} set the same option"
            )
        keys[name] = shown
        values[name] = _value(ctx, path, shown, option, negated, value)
    ctx.default_map = {**(ctx.default_map or {}), **values}


def _hint(key: str, options: dict[str, tuple[click.Option, bool]], name: str) -> str:
    close = difflib.get_close_matches(key, list(options), n=1)
    return (
        f" (did you mean {close[0].replace('_', '-')!r}?)"
        if close
        else f": not an option of `{name}`"
    )


def _options_by_key(command: click.Command) -> dict[str, tuple[click.Option, bool]]:
    """Each option by its long flag's name (dashes as underscores), and whether that
    flag is the negating one (``--no-replay-markers``)."""
    out: dict[str, tuple[click.Option, bool]] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or not param.expose_value:
            continue
        for negated, flags in ((False, param.opts), (True, param.secondary_opts)):
            for flag in flags:
                if flag.startswith("--"):
                    out[flag[2:].replace("-", "_")] = (param, negated)
    return out


def _value(
    ctx: click.Context,
    path: Path,
    shown: str,
    option: click.Option,
    negated: bool,
    value: Any,
) -> Any:
    """``value`` as the option would take it from the command line: the TOML type
    checked (no ``true`` for a number, no number for a name), then the option's own
    conversion and bounds."""
    try:
        raw = _typed(option, value)
    except TypeError as exc:
        raise CommandError(f"{path}: {shown!r}: expected {exc}") from None
    if negated:
        raw = not raw
    try:
        converted = option.type_cast_value(ctx, raw)
        if option.callback is not None:
            option.callback(ctx, option, converted)
    except click.BadParameter as exc:
        raise CommandError(f"{path}: {shown!r}: {exc.message}") from None
    return raw


def _typed(option: click.Option, value: Any) -> Any:
    """``value`` if its TOML type fits the option (raises TypeError naming what
    would), in the form click converts."""
    kind = option.type
    if option.multiple:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise TypeError(f"a list of strings, got {_kind(value)}")
        return tuple(items)
    if option.is_flag and option.is_bool_flag:
        if not isinstance(value, bool):
            raise TypeError(f"true or false, got {_kind(value)}")
        return value
    if isinstance(value, bool):
        raise TypeError(f"{_expected(option)}, got a boolean")
    if isinstance(kind, click.types.IntParamType):
        if not isinstance(value, int):
            raise TypeError(f"an integer, got {_kind(value)}")
        return value
    if isinstance(kind, click.types.FloatParamType):
        if not isinstance(value, int | float):
            raise TypeError(f"a number, got {_kind(value)}")
        return float(value)
    if isinstance(kind, ShellArgs) and isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise TypeError(f"a string or a list of strings, got {_kind(value)}")
        return tuple(value)
    if option.name == "levels" and isinstance(value, int | list):
        if isinstance(value, int):
            value = [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise TypeError(f"a list of integers, got {_kind(value)}")
        return ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise TypeError(f"a string, got {_kind(value)}")
    return value


def _expected(option: click.Option) -> str:
    kind = option.type
    if isinstance(kind, click.types.IntParamType):
        return "an integer"
    if isinstance(kind, click.types.FloatParamType):
        return "a number"
    return "a string"


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__


Entry = tuple[str, Any, str]  # option key, value, the key as the file names it


def _read(path: Path) -> tuple[list[Entry], bool]:
    """The file's (option key, value, shown key) entries, and whether they come
    from a recorded config (run.json) rather than a file of option values."""
    if path.is_dir():
        if not (path / "run.json").is_file():
            raise CommandError(f"{path}: a folder without a run.json")
        path = path / "run.json"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"{path}: cannot read it: {exc}") from None
    if path.suffix == ".json":
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise CommandError(f"{path}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise CommandError(f"{path}: expected a JSON object (a run's run.json)")
        if isinstance(obj.get("config"), dict):
            simulated = obj.get("simulated") is True
            return list(_recorded(path, obj["config"], simulated)), True
        if isinstance(obj.get("schedule"), dict):  # the config object on its own
            return list(_recorded(path, obj, False)), True
        raise CommandError(
            f"{path}: neither a run.json nor its 'config' (no 'config' or 'schedule')"
        )
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CommandError(f"{path}: not TOML: {exc}") from None
    return [(key, value, key) for key, value in table.items()], False


def _recorded(path: Path, cfg: dict[str, Any], simulated: bool) -> Iterator[Entry]:
    """A recorded config's fields as option values. The endpoint URL and model of a
    run against the built-in simulator are not options (it picks them)."""
    endpoint = _section_dict(path, cfg, "endpoint")
    prompt = _section_dict(path, cfg, "prompt")
    for where, fields, known in (
        ("config", cfg, {*_TOP, *_TOP_OTHERS}),
        ("config.endpoint", endpoint, {*_ENDPOINT, *_ENDPOINT_OTHERS}),
        ("config.prompt", prompt, {*_PROMPT, *_PROMPT_OTHERS}),
    ):
        for name in fields:
            if name not in known:
                raise CommandError(
                    f"{path}: {where}.{name}: a field no option sets (recorded by "
                    "another version of the replayer?)"
                )
    for name, key in _TOP.items():
        if cfg.get(name) is not None:
            yield key, cfg[name], f"config.{name}"
    ratio = cfg.get("start_ratio")
    if isinstance(ratio, list) and len(ratio) == 2:
        yield "start-ratio", f"{ratio[0]}-{ratio[1]}", "config.start_ratio"
    elif "start_ratio" in cfg:
        # None: no mid-session starts, even under a profile that would set them.
        yield "start-ratio", "off" if ratio is None else ratio, "config.start_ratio"
    yield from _schedule(path, cfg)
    for name, key in _ENDPOINT.items():
        value = endpoint.get(name)
        if value is None or (simulated and name in ("base_url", "model")):
            continue
        if key.startswith("!"):
            key, value = key[1:], (not value if isinstance(value, bool) else value)
        yield key, value, f"config.endpoint.{name}"
    for name, key in _PROMPT.items():
        if prompt.get(name) is not None:
            yield key, prompt[name], f"config.prompt.{name}"
    salt = prompt.get("salt")
    if salt == "":
        yield "no-cache-bust", True, "config.prompt.salt"
    elif salt is not None:  # the same prompt bytes (a study draws fresh ones)
        yield "salt", salt, "config.prompt.salt"
    lo, hi = prompt.get("token_min"), prompt.get("token_max")
    if lo is not None and hi is not None:
        yield "token-range", f"{lo}-{hi}", "config.prompt.token_min"
    if isinstance(prompt.get("cache_bytes"), int):
        mb = prompt["cache_bytes"] >> 20
        yield "prompt-cache-mb", mb, "config.prompt.cache_bytes"
    labels = _section_dict(path, cfg, "labels")
    extra = []
    for name, value in labels.items():
        if value is None:
            continue
        if name in _LABELS:
            yield _LABELS[name], value, f"config.labels.{name}"
        else:
            extra.append(f"{name}={value}")
    if extra:
        yield "label", extra, "config.labels"


def _section_dict(path: Path, cfg: dict[str, Any], name: str) -> dict[str, Any]:
    value = cfg.get(name, {})
    if not isinstance(value, dict):
        raise CommandError(f"{path}: config.{name}: expected an object")
    return value


def _schedule(path: Path, cfg: dict[str, Any]) -> list[Entry]:
    schedule = _section_dict(path, cfg, "schedule")
    kind = schedule.get("kind", "concurrency")
    where = "config.schedule"
    if kind == "concurrency":
        if schedule.get("concurrency") is None:
            return []
        return [("concurrency", schedule["concurrency"], f"{where}.concurrency")]
    if kind == "session_rate":
        return [
            (key, schedule[name], f"{where}.{name}")
            for name, key in (
                ("session_rate", "session-rate"),
                ("arrival", "arrival"),
                ("burstiness", "burstiness"),
            )
            if schedule.get(name) is not None
        ]
    if kind == "timestamps":
        out: list[Entry] = [("timestamps", True, f"{where}.kind")]
        if schedule.get("speedup") is not None:
            out.append(("speedup", schedule["speedup"], f"{where}.speedup"))
        return out
    raise CommandError(f"{path}: {where}.kind: unknown schedule {kind!r}")
