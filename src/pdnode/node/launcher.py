"""Start one SGLang instance (or the stand-in) from a JSON ServerArgs file.

Runs on the GPU host inside the SGLang virtual environment: standard library only,
Python >= 3.11.

    python -m pdnode.node.launcher [--engine sglang|sim] [--api-key-file PATH] [--dry-run] FILE.json
    python -m pdnode.node.launcher --check [--api-key-file PATH] [--verbose] FILE.json [FILE.json ...]

FILE.json is one JSON object whose keys are SGLang 0.5.23 ServerArgs field names.
Exec mode turns it into `python -m sglang.launch_server --field-name value ...` and
replaces this process with it (os.execv, so systemd supervises the server itself).
The API key never goes on a command line: it is read from --api-key-file and handed
to SGLang in a mode-0600 YAML file through `--config` (SGLang's ConfigArgumentMerger
turns `api-key:` into `--api-key` inside the server process, placed before the real
command-line arguments, so the command line still wins for every other option).

`--check` runs SGLang's own validation exactly as `sglang.launch_server` does --
`prepare_server_args(argv)` (argparse choices), `ServerArgs.resolve_once()` (the
resolution pipeline, which reads the model's config.json) and `check_server_args()`
-- and prints one verdict line per file: exit 0 accepted, 1 rejected, 2 could not
run. It needs the model directory named by model_path (config.json is read; weights
are not) and reads the host where SGLang does (/sys/class/infiniband for
disaggregation_ib_device); run it on the GPU host before starting the service.

Exit status 2 also covers every refusal of exec mode (bad file, bad key file, ...);
each is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import sys
import tempfile
import traceback

from . import releases
from .secrets import SecretError, read_secret_file

SGLANG_VERSION = releases.SGLANG

# --- How SGLang 0.5.23's argparse spells values (from arg_groups/arg_utils.py and the
# fields in arg_groups/fields/*.py). src/pdnode's conformance tests compare these
# tables with the installed parser; `--check` refuses to judge a file whose keys they
# would convert wrongly.

# Booleans registered with argparse.BooleanOptionalAction: true -> --x, false -> --no-x.
# (Every other bool is store_true: true -> --x, false -> omitted.) dllm_fdfo is the one
# bool that defaults to True: `false` must become --no-dllm-fdfo, omitting it keeps it on.
NEGATABLE_BOOLS = frozenset(
    {
        "dcp_replicate_q_proj",
        "dllm_fdfo",
        "enable_decoder_swa_bounded_replay",
        "enable_dsa_fused_indexer",
        "enable_fused_qk_norm_rope",
        "enable_tf32_matmul",
        "enable_tp_lm_head_all_to_all",
        "experts_shared_outer_loras",
        "lora_strict_loading",
        "mm_enable_dp_encoder",
        "ple_offload_embedding",
        "speculative_enable_w4a4_mxfp4_megamoe",
    }
)

# store_true flags whose default is None ("decide from the model"): false cannot be
# said on the command line (nor in SGLang's YAML --config); omitting means auto.
NO_FALSE_BOOLS = frozenset(
    {
        "enable_lean_attention",
        "enable_lora",
        "enable_lora_overlap_loading",
        "enable_multimodal",
    }
)

# list-typed fields whose flag takes ONE JSON string (type json_list_type), not
# repeated values.
JSON_LIST_FIELDS = frozenset(
    {
        "decoupled_spec_connect_endpoints",
        "forward_hooks",
        "remote_instance_weight_loader_send_weights_group_ports",
        "sidecar_args",
    }
)

# Fields whose flag is not --field-name.
FLAG_NAMES = {
    "ep_join_mode": "--elastic-ep-join-mode",
    "ep_join_rank_offset": "--elastic-ep-join-rank-offset",
    "fp4_gemm_runner_backend": "--fp4-gemm-backend",
    "fp8_gemm_runner_backend": "--fp8-gemm-backend",
}

# Keys the launcher refuses: secrets would land on the command line (visible in
# /proc/PID/cmdline and `ps`), and --config is the launcher's own.
REFUSED_KEYS = {
    "api_key": "the API key must not be in the JSON (it would end up on the command "
    "line); pass it with --api-key-file",
    "admin_api_key": "a secret must not be in the JSON (it would end up on the "
    "command line)",
    "ssl_keyfile_password": "a secret must not be in the JSON (it would end up on "
    "the command line)",
    "config": "--config is written by the launcher itself (it carries the API key)",
}

_KEY_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
_HOST_DEPENDENT_HINTS = (
    ("/sys/class/infiniband", "host-dependent: SGLang lists /sys/class/infiniband"),
    ("Invalid IB devices", "host-dependent: SGLang lists /sys/class/infiniband"),
    ("No IB devices found", "host-dependent: SGLang lists /sys/class/infiniband"),
)


class LaunchError(Exception):
    """A refusal: one line for stderr, exit status 2."""


# --------------------------------------------------------------------------- argv


def flag_of(key: str) -> str:
    return FLAG_NAMES.get(key, "--" + key.replace("_", "-"))


def _scalar(key: str, value) -> str:
    if isinstance(value, bool):
        raise LaunchError(f"{key}: a list or mapping item cannot be a boolean")
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise LaunchError(f"{key}: {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, (int, str)):
        return str(value)
    raise LaunchError(f"{key}: unsupported value {value!r}")


def to_argv(serverargs: dict) -> list[str]:
    """ServerArgs dict -> SGLang command-line arguments (no program name).

    true -> --flag (store_true) ; false -> --no-flag for BooleanOptionalAction flags,
    omitted otherwise ; null -> omitted ; lists -> --flag v1 v2 ... (nargs) or one
    JSON string (json_list_type fields) ; dicts -> one JSON string ; numbers -> str.
    Raises LaunchError for keys the launcher cannot pass.
    """
    if not isinstance(serverargs, dict):
        raise LaunchError("the file must hold one JSON object (ServerArgs field -> value)")
    argv: list[str] = []
    for key, value in serverargs.items():
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise LaunchError(
                f"key {key!r} is not a ServerArgs field name (lower case, underscores)"
            )
        if key in REFUSED_KEYS:
            raise LaunchError(f"key {key!r}: {REFUSED_KEYS[key]}")
        flag = flag_of(key)
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                argv.append(flag)
            elif key in NEGATABLE_BOOLS:
                argv.append("--no-" + flag[2:])
            elif key in NO_FALSE_BOOLS:
                raise LaunchError(
                    f"key {key!r}: SGLang {SGLANG_VERSION} cannot be told false for "
                    f"{flag} (it defaults to auto-detect); omit the key or use null"
                )
            continue
        if isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, list):
            if key in JSON_LIST_FIELDS:
                argv += [flag, json.dumps(value, separators=(",", ":"))]
            else:
                argv.append(flag)
                argv += [_scalar(key, item) for item in value]
        else:
            text = _scalar(key, value)
            if text.startswith("-"):
                # "--flag=-x": argparse would read a separate "-x" as an option.
                argv.append(f"{flag}={text}")
            else:
                argv += [flag, text]
    return argv


def load_serverargs(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise LaunchError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise LaunchError(f"{path} is not UTF-8 text: {e.reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LaunchError(
            f"{path} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from None
    if not isinstance(data, dict):
        raise LaunchError(
            f"{path} must hold one JSON object (ServerArgs field -> value), "
            f"not {type(data).__name__}"
        )
    return data


# --------------------------------------------------------------------------- API key


def read_api_key(path: str) -> str:
    """The key in PATH (see pdnode.node.secrets): refuses unsafe or empty files."""
    try:
        return read_secret_file(path)
    except SecretError as exc:
        raise LaunchError(str(exc).replace("secret file", "API key file")) from None


def config_dir() -> str:
    """$RUNTIME_DIRECTORY (systemd's RuntimeDirectory=, first entry), else a private
    new temporary directory."""
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime:
        if not os.path.isdir(runtime):
            raise LaunchError(f"RUNTIME_DIRECTORY {runtime} is not a directory")
        return runtime
    return tempfile.mkdtemp(prefix="pdnode-launch-")


def write_key_config(key: str, directory: str, stem: str) -> str:
    """Write `api-key: "<key>"` to DIRECTORY/STEM.sglang-config.yaml, mode 0600,
    atomically (a new file renamed over the old one; a planted symlink is replaced,
    never followed).

    The YAML key is spelled with a dash on purpose: SGLang 0.5.23's
    ConfigArgumentMerger turns each YAML key into `--<key>` verbatim, so `api_key:`
    would become `--api_key`, which its argparse rejects ("unrecognized arguments").
    """
    path = os.path.join(directory, f"{stem}.sglang-config.yaml")
    # A JSON string is a valid YAML double-quoted scalar; the key has no control
    # characters (read_api_key), so escapes stay simple.
    body = "# written by pdnode.node.launcher; read by SGLang via --config\n"
    body += f"api-key: {json.dumps(key)}\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=".yaml", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def redact(argv: list[str], secret: str | None) -> list[str]:
    if not secret:
        return list(argv)
    return [a.replace(secret, "<redacted>") for a in argv]


def _stem(path: str) -> str:
    base = os.path.basename(path)
    stem = base[:-5] if base.endswith(".json") else base
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "serverargs"


# --------------------------------------------------------------------------- exec


def build_exec(engine: str, path: str, key_file: str | None) -> tuple[list[str], dict, str | None]:
    """(argv, environment, key) for os.execve; writes the key config for sglang."""
    serverargs = load_serverargs(path)
    key = read_api_key(key_file) if key_file else None
    env = dict(os.environ)
    if engine == "sglang":
        argv = [sys.executable, "-m", "sglang.launch_server", *to_argv(serverargs)]
        if key is not None:
            argv += ["--config", write_key_config(key, config_dir(), _stem(path))]
    elif engine == "sim":
        to_argv(serverargs)  # same refusals as the real engine
        argv = [sys.executable, "-m", "pdnode.standin", path]
        if key_file:
            argv += ["--api-key-file", key_file]
        # the stand-in lives next to this module; keep it importable after exec
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if here not in parts:
            env["PYTHONPATH"] = os.pathsep.join([here, *parts])
    else:  # argparse's choices make this unreachable from the command line
        raise LaunchError(f"unknown engine {engine!r} (sglang or sim)")
    return argv, env, key


def start_watchdog(url: str, env: dict) -> int | None:
    """Start the watchdog sidecar (pdnode.node.watchdog) for this process, which is about to
    become the engine; return its pid, or None when systemd asked for no watchdog.

    systemd gives the main process WATCHDOG_USEC/WATCHDOG_PID and NOTIFY_SOCKET. They
    are taken out of the engine's environment (`env`): only the sidecar, which checks
    /health, may ping. The sidecar is started through a short-lived intermediate child
    (double fork), so it is not a child of the engine (nothing for the engine to reap or
    wait on) and stays in the service's cgroup, where NotifyAccess=all accepts it.
    """
    usec = env.pop("WATCHDOG_USEC", "")
    owner = env.pop("WATCHDOG_PID", "")
    address = env.pop("NOTIFY_SOCKET", "")
    engine = os.getpid()
    if not usec or not address or (owner and owner != str(engine)):
        return None
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the intermediate child: start the sidecar, report its pid, leave
        try:
            os.close(r)
            sidecar = os.fork()
            if sidecar == 0:
                os.close(w)
                try:
                    os.execve(sys.executable, [sys.executable, "-m", "pdnode.node.watchdog", "--pid", str(engine),
                                               "--url", url],
                              {**env, "NOTIFY_SOCKET": address, "WATCHDOG_USEC": usec})
                except OSError as e:
                    sys.stderr.write(f"pdnode-launch: error: cannot start the watchdog sidecar: {e}\n")
                    os._exit(1)
            os.write(w, str(sidecar).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    with os.fdopen(r) as f:
        text = f.read()
    return int(text) if text.isdigit() else None


# --------------------------------------------------------------------------- check


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(exc: BaseException) -> str:
    """SGLang's reason, one line; a bare assert gets its source line."""
    msg = _one_line(str(exc))
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}"
    if isinstance(exc, AssertionError):
        if msg:
            text = f"{msg} ({where})" if where else msg
        else:
            line = _one_line(frames[-1].line) if frames and frames[-1].line else ""
            # a multi-line assert: the frame holds its first line only
            text = f"AssertionError: '{line}'" if line else "AssertionError"
            if where:
                text += f" ({where})"
    else:
        text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
        if where:
            text += f" ({where})"
    for needle, hint in _HOST_DEPENDENT_HINTS:
        if needle in msg:
            text += f" [{hint}]"
            break
    return text


def _parser_tables(parser: argparse.ArgumentParser) -> dict:
    """The launcher's tables as the installed SGLang would have them."""
    negatable, no_false, json_list, flag_names = set(), set(), set(), {}
    for action in parser._actions:
        dest = action.dest
        if isinstance(action, argparse.BooleanOptionalAction):
            negatable.add(dest)
        elif isinstance(action, argparse._StoreTrueAction) and action.default is not False:
            no_false.add(dest)  # default None (auto) or True: false cannot be said
        if getattr(action.type, "__name__", "") == "json_list_type":
            json_list.add(dest)
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and ("--" + dest.replace("_", "-")) not in parser._option_string_actions:
            flag_names[dest] = longs[0]
    return {
        "NEGATABLE_BOOLS": negatable,
        "NO_FALSE_BOOLS": no_false,
        "JSON_LIST_FIELDS": json_list,
        "FLAG_NAMES": flag_names,
    }


def table_drift(parser: argparse.ArgumentParser) -> dict:
    """{table: (missing from the launcher, stale in the launcher)} -- empty if none."""
    live = _parser_tables(parser)
    ours = {
        "NEGATABLE_BOOLS": set(NEGATABLE_BOOLS),
        "NO_FALSE_BOOLS": set(NO_FALSE_BOOLS),
        "JSON_LIST_FIELDS": set(JSON_LIST_FIELDS),
        "FLAG_NAMES": set(FLAG_NAMES.items()),
    }
    live["FLAG_NAMES"] = set(live["FLAG_NAMES"].items())
    drift = {}
    for name, mine in ours.items():
        missing, stale = live[name] - mine, mine - live[name]
        if missing or stale:
            drift[name] = (sorted(missing), sorted(stale))
    return drift


def _unknown_keys(serverargs: dict, parser: argparse.ArgumentParser, fields: set) -> str | None:
    for key in serverargs:
        flag = flag_of(key)
        action = parser._option_string_actions.get(flag)
        # a flag that stores into no ServerArgs field (--help, ...) is no key either
        if action is None or (key not in fields and action.dest not in fields):
            if key in fields:
                return (
                    f"key {key!r} is a ServerArgs field without a command-line flag "
                    f"in SGLang {SGLANG_VERSION}; the launcher cannot pass it"
                )
            return (
                f"unknown key {key!r}: SGLang {SGLANG_VERSION} has no ServerArgs "
                f"field or flag {flag}"
            )
    return None


class _SGLang:
    """What --check needs from the installed SGLang, imported once."""

    def __init__(self):
        import sglang  # noqa: F401
        from sglang.srt.arg_groups.arg_utils import record_fields
        from sglang.srt.server_args import ServerArgs, prepare_server_args

        try:
            from importlib.metadata import version

            self.version = version("sglang")
        except Exception:
            self.version = getattr(sglang, "__version__", "?")
        try:
            from sglang.srt.plugins import load_plugins
        except ImportError:
            load_plugins = None
        if load_plugins is not None:
            load_plugins()  # as sglang.launch_server does before it parses arguments
        self.prepare_server_args = prepare_server_args
        self.parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(self.parser)
        self.fields = {f.name for f in record_fields(ServerArgs)}
        self.drifted = {
            item[0] if isinstance(item, tuple) else item
            for missing, stale in table_drift(self.parser).values()
            for item in (*missing, *stale)
        }

    def warm_up(self) -> None:
        """Import what resolution imports lazily (about 1300 modules), so forked
        children do not each import it again. Imports only: no hook runs here."""
        import importlib
        import pkgutil

        import sglang.srt.arg_groups as groups

        names = [
            f"sglang.srt.arg_groups.{m.name}"
            for m in pkgutil.iter_modules(groups.__path__)
            if m.name.endswith("_hook") or m.name in ("pipeline", "overrides")
        ]
        for name in [*names, "sglang.srt.configs.model_config"]:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def check(paths, key_file: str | None = None, verbose: bool = False) -> int:
    """Validate each file with the installed SGLang; one verdict line per file.

    Exit status: 0 all accepted, 1 some rejected, 2 some could not be checked.
    SGLang is imported once; with several files each is judged in a forked child,
    so no resolution side effect (environment variables, module state) carries
    from one file to the next.
    """
    if isinstance(paths, str):
        paths = [paths]
    try:
        key = read_api_key(key_file) if key_file else None
    except LaunchError as e:
        for path in paths:
            print(f"CANNOT CHECK: {os.path.basename(path)}: {_one_line(str(e))}")
        return 2

    # Files that cannot be read are reported without paying for SGLang's import.
    unreadable = {}
    for path in paths:
        try:
            load_serverargs(path)
        except LaunchError as e:
            unreadable[path] = f"CANNOT CHECK: {os.path.basename(path)}: {_one_line(str(e))}"
    sgl = None
    if len(unreadable) < len(paths):
        # Offline, and no accelerator probing: --device cuda is what the GPU host
        # auto-detects; no CUDA call is made while arguments are resolved.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        logs = io.StringIO()
        try:
            with contextlib.redirect_stdout(logs), contextlib.redirect_stderr(logs):
                sgl = _SGLang()
                if len(paths) - len(unreadable) > 1:
                    sgl.warm_up()
        except Exception as e:  # ImportError, or a broken install raising anything
            if verbose:
                sys.stderr.write(logs.getvalue())
            for path in paths:
                unreadable.setdefault(
                    path,
                    f"CANNOT CHECK: {os.path.basename(path)}: SGLang is not importable "
                    f"here: {type(e).__name__}: {_one_line(str(e))}",
                )
        else:
            if verbose:
                sys.stderr.write(logs.getvalue())

    worst = 0
    for path in paths:
        if path in unreadable:
            code, verdict, log = 2, unreadable[path], ""
        elif len(paths) == 1:
            code, verdict, log = _check_captured(path, key, sgl)
        else:
            code, verdict, log = _in_child(_check_captured, path, key, sgl)
        if verbose:
            sys.stderr.write("".join(redact([log], key)))
        # SGLang's own messages may quote the merged arguments, the key among them
        print(redact([verdict], key)[0], flush=True)
        worst = max(worst, code)  # 2 (cannot check) > 1 (rejected) > 0
    return worst


def _in_child(fn, *args):
    """Run fn(*args) -> (int, str, str) in a forked child; return its result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            result = fn(*args)
        except BaseException as e:
            result = (2, f"CANNOT CHECK: {os.path.basename(args[0])}: internal error: {e!r}", "")
        data = json.dumps(result).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
        os.close(w)
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    try:
        code, verdict, log = json.loads(b"".join(chunks))
    except ValueError:
        return 2, f"CANNOT CHECK: {os.path.basename(args[0])}: checker died ({status:#x})", ""
    return code, verdict, log


def _check_captured(path: str, key: str | None, sgl: _SGLang) -> tuple[int, str, str]:
    logs = io.StringIO()
    with contextlib.redirect_stdout(logs), contextlib.redirect_stderr(logs):
        code, verdict = _check_one(path, key, sgl)
    return code, verdict, logs.getvalue()


def _check_one(path: str, key: str | None, sgl: _SGLang) -> tuple[int, str]:
    name = os.path.basename(path)

    def cannot(msg: str) -> tuple[int, str]:
        return 2, f"CANNOT CHECK: {name}: {_one_line(msg)}"

    def rejected(msg: str) -> tuple[int, str]:
        return 1, f"REJECTED: {name}: {_one_line(msg)}"

    try:
        serverargs = load_serverargs(path)
    except LaunchError as e:
        return cannot(str(e))
    try:
        argv = to_argv(serverargs)
    except LaunchError as e:
        return rejected(str(e))
    problem = _unknown_keys(serverargs, sgl.parser, sgl.fields)
    if problem:
        return rejected(problem)
    affected = sorted(k for k in serverargs if k in sgl.drifted)
    if affected:
        return cannot(
            f"the launcher's flag tables do not match SGLang {sgl.version} for "
            f"{', '.join(affected)}; update pdnode/node/launcher.py"
        )

    if "device" not in serverargs:
        argv += ["--device", "cuda"]
    tmpdir = tempfile.mkdtemp(prefix="pdnode-check-") if key is not None else None
    try:
        if key is not None:
            argv += ["--config", write_key_config(key, tmpdir, _stem(path))]
        return _validate(argv, name, key, sgl)
    finally:
        if tmpdir:
            for entry in os.listdir(tmpdir):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(tmpdir, entry))
            with contextlib.suppress(OSError):
                os.rmdir(tmpdir)


def _validate(argv: list[str], name: str, key: str | None, sgl: _SGLang) -> tuple[int, str]:
    """The three validation stages of `sglang.launch_server`, starting from argv."""
    # SGLang's logging handler binds to sys.stderr as it is during
    # prepare_server_args (logging.basicConfig(force=True)): keep one buffer for all
    # three stages, and hand it on afterwards.
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return _stages(argv, name, key, sgl, err)
    finally:
        sys.stderr.write(err.getvalue())


def _stages(argv, name, key, sgl, err) -> tuple[int, str]:
    def rejected(msg: str) -> tuple[int, str]:
        return 1, f"REJECTED: {name}: {_one_line(msg)}"

    try:
        server_args = sgl.prepare_server_args(argv)
    except SystemExit as e:
        # argparse printed "sglang serve: error: ..." (after its usage) and exited
        errs = [ln for ln in err.getvalue().splitlines() if ": error: " in ln]
        msg = errs[-1].split(": error: ", 1)[1] if errs else f"argparse exit {e.code}"
        return rejected(f"argument parsing: {msg}")
    except Exception as e:
        return rejected(_describe(e))

    stage = "resolve_once"
    try:
        server_args.resolve_once()
        stage = "check_server_args"
        server_args.check_server_args()
    except ImportError as e:
        return 2, (
            f"CANNOT CHECK: {name}: {stage} needs a module this environment "
            f"lacks: {_one_line(str(e))}"
        )
    except Exception as e:
        return rejected(_describe(e))
    if key is not None and getattr(server_args, "api_key", None) != key:
        return 2, f"CANNOT CHECK: {name}: SGLang did not take the API key from --config"
    return 0, f"OK: {name} accepted by SGLang {sgl.version}"


# --------------------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage as well)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    p = _Parser(
        prog="pdnode-launch",
        description="Start SGLang (or the stand-in) from a JSON ServerArgs file.",
    )
    p.add_argument("--engine", choices=("sglang", "sim"), default="sglang")
    p.add_argument("--api-key-file", metavar="PATH")
    p.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    p.add_argument(
        "--check",
        action="store_true",
        help="validate FILE with the installed SGLang (exit 0 accepted, 1 rejected, 2 cannot run)",
    )
    p.add_argument("--verbose", action="store_true", help="with --check: show SGLang's log")
    p.add_argument("--watchdog-url", metavar="URL",
                   help="the engine's /health: feed systemd's watchdog from it (when WatchdogSec= is set)")
    p.add_argument("files", nargs="+", metavar="FILE.json", help="one file; several with --check")
    args = p.parse_args(argv)

    if args.check:
        return check(args.files, args.api_key_file, args.verbose)
    if len(args.files) != 1:
        p.error("exactly one FILE.json to launch (several only with --check)")
    try:
        cmd, env, key = build_exec(args.engine, args.files[0], args.api_key_file)
    except LaunchError as e:
        sys.stderr.write(f"{p.prog}: error: {e}\n")
        return 2
    if args.dry_run:
        print(shlex.join(redact(cmd, key)))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    if args.watchdog_url:
        start_watchdog(args.watchdog_url, env)
    try:
        os.execve(cmd[0], cmd, env)
    except OSError as e:
        sys.stderr.write(f"{p.prog}: error: cannot exec {cmd[0]}: {e.strerror or e}\n")
        return 2
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
