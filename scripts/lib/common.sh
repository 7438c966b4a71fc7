# Shared shell helpers for scripts/*. Sourced, never executed.
# shellcheck shell=bash

repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd; }

# Python caches the bytecode of what it imports (__pycache__/: in .gitignore, the
# collection's build_ignore and the bundle's exclusions). Some shells turn that off; then
# every process compiles its imports from source again, and Ansible forks one per task:
# 40% of a deploy's controller CPU and half of ansible-playbook's start
# (docs/measurements.md, "Bytecode caches").
unset PYTHONDONTWRITEBYTECODE

say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 2; }

# uv installs the toolchain in seconds where pip takes minutes (issue 30); pip stays the
# fallback where uv cannot be had. The one pin of it.
UV_VERSION=0.13.9

# Print the path of a Python >= 3.12 (ansible-core 2.21 needs it on the controller).
# Order: $PDNODE_PYTHON, python3.13/python3.12 on PATH, pyenv's newest 3.12+/3.13,
# plain python3. Nothing here names a path of one particular machine.
find_python312() {
  local cand v
  local -a cands=()
  [ -n "${PDNODE_PYTHON:-}" ] && cands+=("$PDNODE_PYTHON")
  cands+=(python3.13 python3.12)
  if command -v pyenv >/dev/null 2>&1; then
    local root; root=$(pyenv root)
    for v in $(ls -1 "$root/versions" 2>/dev/null | grep -E '^3\.(1[2-9])\.[0-9]+$' | sort -t. -k2,2n -k3,3n -r); do
      cands+=("$root/versions/$v/bin/python3")
    done
  fi
  cands+=(python3)
  for cand in "${cands[@]}"; do
    command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
    if "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$cand" 2>/dev/null || echo "$cand"
      return 0
    fi
  done
  return 1
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "'$*' needs root (run as root or install sudo)"; fi
}

# The packages named in scripts/lib/system-packages (first word of each line).
system_packages() {
  sed -e 's/#.*//' "$(repo_root)/scripts/lib/system-packages" | awk 'NF { print $1 }'
}

# Install the missing ones with apt-get. Where there is no dpkg (not Debian/Ubuntu),
# say what is needed and go on: the tests that need a package name it when it is missing.
ensure_system_packages() {
  local -a missing=()
  local p
  if ! command -v dpkg-query >/dev/null 2>&1; then
    say "not a Debian-family machine: install these yourself: $(system_packages | tr '\n' ' ')"
    return 0
  fi
  for p in $(system_packages); do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get here"
  say "installing system packages: ${missing[*]} (apt-get)"
  local log; log=$(mktemp)
  as_root apt-get update -qq >"$log" 2>&1 || { tail -n 15 "$log" >&2; die "apt-get update failed"; }
  # Debian's docker.io postinst may try to start the daemon; scripts/substrate starts it
  # itself when it is not running, so either outcome is fine.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >>"$log" 2>&1 ||
    { tail -n 15 "$log" >&2; die "apt-get install ${missing[*]} failed (log: $log)"; }
  rm -f "$log"
}
