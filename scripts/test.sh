#!/usr/bin/env bash
# The project's whole test run: linters, syntax check, unit tests, molecule scenarios on the
# lab image. Each step's outcome is collected; the last line is a pytest-style summary.
#   scripts/test.sh            everything
#   GPUENV_TEST_STEPS="ruff unit" scripts/test.sh   only the named steps
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

scripts/host-prereqs.sh || exit 1
scripts/venv.sh || exit 1
# shellcheck disable=SC1091
. .venv/bin/activate
export ANSIBLE_CONFIG="$PWD/ansible.cfg"

passed=0 failed=0 failed_names=()
want() { [ -z "${GPUENV_TEST_STEPS:-}" ] || [[ " $GPUENV_TEST_STEPS " == *" $1 "* ]]; }
step() {
  local name=$1; shift
  want "$name" || return 0
  local t0=$SECONDS
  printf '\n=== %s: %s\n' "$name" "$*"
  if "$@"; then
    passed=$((passed + 1)); printf '=== %s PASSED (%ss)\n' "$name" $((SECONDS - t0))
  else
    failed=$((failed + 1)); failed_names+=("$name"); printf '=== %s FAILED (%ss)\n' "$name" $((SECONDS - t0))
  fi
}

step ruff ruff check .
step ruff-format ruff format --check .
step yamllint yamllint --strict .
step ansible-lint ansible-lint --profile production --strict
step syntax ansible-playbook site.yml --syntax-check -i inventory/example
step unit python -m pytest -q tests/unit
step integration python -m pytest -q tests/integration

scenarios=()
for d in molecule/*/ roles/*/molecule/*/; do
  [ -f "$d/molecule.yml" ] && scenarios+=("$d")
done
if [ "${#scenarios[@]}" -gt 0 ] && want molecule-images; then
  step molecule-images gpuenv lab build --distro trixie --distro bookworm
fi
for d in "${scenarios[@]}"; do
  d=${d%/}; scenario=${d##*/}; base=${d%/molecule/*}
  # A top-level scenario (molecule/NAME) runs from the repository root.
  [ "$base" = "$d" ] && base=.
  step "molecule:${base##*/}/$scenario" bash -c "cd '$base' && molecule test -s '$scenario'"
done

echo
for n in "${failed_names[@]}"; do echo "FAILED $n"; done
echo "=== test.sh finished in $(( $(date +%s) - start ))s"
echo "steps: ${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
