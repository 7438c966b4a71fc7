# Shared shell helpers for scripts/*. Sourced, never executed.
# shellcheck shell=bash

repo_root() { cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd; }

say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 2; }

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
