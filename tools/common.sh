# Shared by the tools/check_*.sh scripts: sourced, not run.

say() { echo "$(basename "$0"): $*"; }

# What is missing, and how to get it: a failure under CI=true; elsewhere the check is skipped.
missing() {
  say "MISSING: $1" >&2
  if [ "${CI:-}" = "true" ]; then
    say "FAILED: CI runs this check, and it could not be made" >&2
    exit 1
  fi
  say "skipped: this check was NOT run" >&2
  exit 0
}

# A copy of the checkout's files (tracked, and untracked but not ignored) in $1, keeping $1/build
# (the previous build's objects), so that a special build leaves the checkout's own alone.
copy_tree() {
  local root dest="$1"
  root="$(cd "$(dirname "$0")/.." && pwd)"
  command -v git >/dev/null || missing "git is needed to copy the tree."
  say "copying the tree to $dest"
  mkdir -p "$dest"
  find "$dest" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
  git -C "$root" ls-files -co --exclude-standard -z | tar -C "$root" --null -T - -cf - | tar -C "$dest" -xf -
}

# A virtual environment at $1 with the packages $2... (installed or brought up to date). Without
# pip's byte-compiling of every module it installs: torch's thousands, most of which no check
# imports, took 34-57 s of CPU a venv beside CI's other stages (benchmarks/NOTES.md, section 134);
# Python compiles a module when it is first imported.
make_venv() {
  local venv="$1"
  shift
  if [ ! -x "$venv/bin/python" ]; then
    say "making $venv with $*"
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q --no-compile "$@" || missing "pip could not install $* into $venv."
}
