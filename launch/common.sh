# shellcheck shell=bash
# Shared by the launch scripts: KEY=VALUE settings before the program's flags.
# parse_settings "ALLOWED NAMES" "$@" sets each allowed NAME given as NAME=VALUE and leaves the rest
# of the arguments (the program's flags) in the array PROGRAM_ARGS.
parse_settings() {
  local allowed=" $1 "
  shift
  while [[ $# -gt 0 && "$1" == *=* && "$1" != --* ]]; do
    local name="${1%%=*}"
    if [[ "$allowed" != *" $name "* ]]; then
      echo "error: unknown setting $name: use one of$allowed" >&2
      exit 2
    fi
    printf -v "$name" '%s' "${1#*=}"
    shift
  done
  # shellcheck disable=SC2034  # read by the script that sources this file
  PROGRAM_ARGS=("$@")
}

# require_count NAME VALUE [MIN]: exits with one line unless VALUE is a whole number of at least MIN (default 1).
require_count() {
  if ! [[ "$2" =~ ^[0-9]+$ ]] || (($2 < ${3:-1})); then
    echo "error: $1=$2: it must be a whole number of at least ${3:-1}" >&2
    exit 2
  fi
}

# require_program NAME: exits with one line unless minilm_jax has a program NAME (a module or
# package that `python -m minilm_jax.NAME` starts through run_program).
require_program() {
  local package
  package="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/minilm_jax"
  local module="$package/$1.py"
  [[ -f "$package/$1/__main__.py" ]] && module="$package/$1/__main__.py"
  if [[ ! "$1" =~ ^[a-z_]+$ ]] || ! grep -qs "^  run_program(main" "$module"; then
    local known
    known="$(grep -ls "^  run_program(main" "$package"/*.py "$package"/*/__main__.py | sed -E 's#.*/minilm_jax/##; s#/__main__\.py$##; s#\.py$##' | sort | tr '\n' ' ')"
    echo "error: PROGRAM=$1 is not a minilm_jax program: use one of ${known% }" >&2
    exit 2
  fi
}
