#!/bin/bash
# gpuenv pull-mode bootstrap (docs/cloud.md): cloud-init's runcmd runs it once on a new instance.
# Stages: sources -> packages -> venv -> fetch -> secrets -> converge -> check. Each stage logs to
# /var/log/gpuenv-bootstrap.log and is recorded in /var/lib/gpuenv/ready.json, which a user or
# a controller polls: status running|done|failed, the stage, why it failed, and the verdict of
# this node's own `gpuenv check`. Settings come from the env file cloud-init wrote beside it.
set -Eeuo pipefail
umask 022

# Tests point GPUENV_ROOT at a scratch folder; on an instance every path is the real one.
root=${GPUENV_ROOT:-}
# shellcheck source=/dev/null
. "${GPUENV_BOOTSTRAP_ENV:-$root/etc/gpuenv/bootstrap.env}"

conf_dir=$root/etc/gpuenv
state_dir=$root/var/lib/gpuenv
marker=$state_dir/ready.json
check_report=$state_dir/check.json
log=$root/var/log/gpuenv-bootstrap.log
work=$root/opt/gpuenv-bootstrap
venv=$work/venv
project=$work/project
# --ca-bundle's certificates: trusted for fetching the source and for nothing else (curl and
# git are told to use them; the system's trust store is left as the image and the site set it).
source_ca=${GPUENV_SOURCE_CA:+$root$GPUENV_SOURCE_CA}
# Secrets never travel in user data: a file the user places, or GPUENV_SECRETS_COMMAND's output.
secrets=${GPUENV_SECRETS_FILE:-$conf_dir/secrets.yml}
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
stage=start
verdict=""
commit=""
node=$(hostname -s)

mkdir -p "$state_dir" "${log%/*}" "$work"
chmod 0755 "$state_dir"

export DEBIAN_FRONTEND=noninteractive PIP_CONFIG_FILE=$conf_dir/pip.conf
export PIP_DISABLE_PIP_VERSION_CHECK=1 ANSIBLE_FORCE_COLOR=0
for var in http_proxy https_proxy no_proxy; do
  upper=${var^^}
  name=GPUENV_$upper
  value=${!name:-}
  if [ -n "$value" ]; then
    export "$var=$value" "$upper=$value"
  fi
done

marker_py='
import datetime, json, os, sys
e = os.environ
status = e["M_STATUS"]
doc = {
    "schema_version": 1,
    "kind": "gpuenv-bootstrap",
    "node": e["M_NODE"],
    "status": status,
    "stage": e["M_STAGE"],
    "verdict": e["M_VERDICT"] or None,
    "reason": e["M_REASON"] or None,
    "group": e["M_GROUP"],
    "source": e["M_SOURCE"],
    "ref": e["M_REF"],
    "commit": e["M_COMMIT"] or None,
    "started": e["M_STARTED"],
    "finished": None if status == "running"
    else datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "log": e["M_LOG"],
    "check_report": e["M_CHECK"] if os.path.exists(e["M_CHECK"]) else None,
}
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.chmod(tmp, 0o644)
os.replace(tmp, sys.argv[1])
'

# mark STATUS REASON: rewrite the marker (atomically: a poller never reads half a file).
mark() {
  M_STATUS=$1 M_REASON=$2 M_STAGE=$stage M_VERDICT=$verdict M_COMMIT=$commit M_NODE=$node \
    M_GROUP=$GPUENV_GROUP M_SOURCE=$GPUENV_SOURCE M_REF=$GPUENV_REF M_STARTED=$started \
    M_LOG=${log#"$root"} M_CHECK=$check_report python3 -c "$marker_py" "$marker"
}

# why FIRST_LINE RC: the lines of this stage's log that say what went wrong.
why() {
  local lines
  lines=$(tail -n +"$1" "$log" | grep -E '^(fatal|failed|ERROR|\[ERROR\])' | tail -n 2 || true)
  [ -n "$lines" ] || lines=$(tail -n +"$1" "$log" | grep -v '^[[:space:]]*$' | tail -n 3 || true)
  printf 'stage %s failed (exit %s): %s' "$stage" "$2" "$(printf '%s' "$lines" | tr '\n' ' ' | cut -c1-600)"
}

# run STAGE FUNCTION: one stage, its output appended to the log. The function runs as a
# background job so that `set -e` holds inside it (a function called in an `||` list ignores it).
run() {
  stage=$1
  mark running ""
  printf '== %s stage %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$stage" >>"$log"
  local first rc=0
  first=$(($(wc -l <"$log") + 1))
  "$2" >>"$log" 2>&1 &
  wait "$!" || rc=$?
  if [ "$rc" -ne 0 ]; then
    mark failed "$(why "$first" "$rc")"
    exit 1
  fi
}

do_sources() {
  # apt's settings: the file the sources role owns, with the body it writes there (proxies, a
  # site cache, DIRECT hosts), rendered by `gpuenv cloud-init` from the node floor's rules.
  if [ -n "${GPUENV_APT_CONF:-}" ]; then
    mkdir -p "$root${GPUENV_APT_CONF_FILE%/*}"
    printf '%s' "$GPUENV_APT_CONF" >"$root$GPUENV_APT_CONF_FILE"
    echo "apt settings written to $GPUENV_APT_CONF_FILE"
  fi
  if [ -z "${GPUENV_APT_SED_DEBIAN:-}${GPUENV_APT_SED_UBUNTU:-}" ]; then
    echo "apt sources left as the image has them (preset official)"
    return 0
  fi
  local id files=() script
  # shellcheck source=/dev/null
  id=$(. "$root/etc/os-release" && printf %s "$ID")
  case "$id" in
    debian) script=$GPUENV_APT_SED_DEBIAN ;;
    ubuntu) script=$GPUENV_APT_SED_UBUNTU ;;
    *)
      echo "unsupported OS '$id': gpuenv supports Debian 12, 13 and Ubuntu 22.04, 24.04" >&2
      return 1
      ;;
  esac
  for f in "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*.list \
    "$root"/etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ "${#files[@]}" -gt 0 ] || { echo "no apt sources files to point at the mirror"; return 0; }
  # The sources role's rules (the node floor's sources.apt_rules) as a sed script, one line each.
  sed -i -E -e "$script" "${files[@]}"
  echo "apt sources now use the mirror: ${files[*]#"$root"}"
}

do_packages() {
  local attempt
  for attempt in 1 2 3; do
    apt-get -o DPkg::Lock::Timeout=600 update && break
    [ "$attempt" -lt 3 ] || return 1
    sleep 10
  done
  apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
    python3-venv git curl ca-certificates
}

do_venv() {
  local requirement=$GPUENV_ANSIBLE
  # ansible-core 2.18+ needs Python 3.11 on the controller; Ubuntu 22.04 has 3.10.
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || requirement=$GPUENV_ANSIBLE_PY310
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  # setuptools: the gpu_env role builds the gpuenv wheel with this interpreter (no isolation), so
  # it needs what pyproject.toml's [build-system] requires.
  "$venv/bin/python" -m pip install --quiet "$requirement" "$GPUENV_SETUPTOOLS" wheel
  "$venv/bin/ansible-playbook" --version
}

do_fetch() {
  local new=$project.new archive sum want=${GPUENV_COMMIT:-$GPUENV_REF} got
  rm -rf "$new"
  mkdir -p "$new"
  case "$GPUENV_SOURCE" in
    *.tar.gz | *.tgz | *.tar)
      archive=$work/source.tar
      curl -fsSL --proto =https --retry 3 ${source_ca:+--cacert "$source_ca"} -o "$archive" \
        "${GPUENV_SOURCE//\{ref\}/$GPUENV_REF}"
      # The checksum is checked before the archive is even unpacked.
      if [ -n "${GPUENV_SHA256:-}" ]; then
        sum=$(sha256sum "$archive" | cut -d' ' -f1)
        if [ "$sum" != "$GPUENV_SHA256" ]; then
          echo "ERROR: SHA-256 of $GPUENV_SOURCE is $sum, expected $GPUENV_SHA256" >&2
          rm -f "$archive"
          return 1
        fi
        echo "SHA-256 of the tarball checked: $sum"
      fi
      tar -xf "$archive" -C "$new" --strip-components=1
      ;;
    *)
      git -C "$new" init -q
      git -C "$new" ${source_ca:+-c "http.sslCAInfo=$source_ca"} fetch -q --depth 1 \
        "$GPUENV_SOURCE" "$want"
      git -C "$new" checkout -q FETCH_HEAD
      got=$(git -C "$new" rev-parse HEAD)
      if [ -n "${GPUENV_COMMIT:-}" ] && [ "$got" != "$GPUENV_COMMIT" ]; then
        echo "ERROR: $GPUENV_SOURCE gave commit $got, pinned $GPUENV_COMMIT" >&2
        return 1
      fi
      printf '%s\n' "$got" >"$work/commit"
      ;;
  esac
  [ -f "$new/$GPUENV_PLAYBOOK" ] || {
    echo "ERROR: $GPUENV_SOURCE at $GPUENV_REF has no $GPUENV_PLAYBOOK" >&2
    return 1
  }
  rm -rf "$project"
  mv "$new" "$project"
}

do_secrets() {
  # The command's output (e.g. a cloud secret store read with the instance's own role) goes to
  # the secrets file, never to the log; the file is root's alone.
  if [ -n "${GPUENV_SECRETS_COMMAND:-}" ]; then
    mkdir -p "${secrets%/*}"
    (umask 077 && bash -c "$GPUENV_SECRETS_COMMAND" >"$secrets.new")
    mv "$secrets.new" "$secrets"
    echo "secrets written to ${secrets#"$root"} by GPUENV_SECRETS_COMMAND"
  fi
  if [ ! -e "$secrets" ]; then
    echo "no secrets file ${secrets#"$root"}: none passed"
    return 0
  fi
  chmod 0600 "$secrets"
  echo "secrets file ${secrets#"$root"} is passed to ansible-playbook as extra variables"
}

do_converge() {
  local inventory=$conf_dir/inventory
  mkdir -p "$inventory"
  printf 'all:\n  children:\n    %s:\n      hosts:\n        %s:\n' "$GPUENV_GROUP" "$node" >"$inventory/hosts.yml"
  printf '          ansible_connection: local\n          ansible_python_interpreter: /usr/bin/python3\n' \
    >>"$inventory/hosts.yml"
  cd "$project"
  local extra=()
  [ ! -e "$secrets" ] || extra=(--extra-vars "@$secrets")
  "$venv/bin/ansible-playbook" "$GPUENV_PLAYBOOK" -i "$inventory/hosts.yml" \
    --skip-tags "$GPUENV_SKIP_TAGS" "${extra[@]}"
}

do_check() {
  local rc=0
  rm -f "$check_report"
  "$GPUENV_NODE_VENV/bin/gpuenv" check --node "$node" --json "$check_report" \
    --profile "${GPUENV_CHECK_PROFILE:-quick}" || rc=$?
  case "$rc" in
    0) verdict=pass ;;
    1) verdict=fail ;;
    *) return "$rc" ;;
  esac
  printf '%s\n' "$verdict" >"$work/verdict"
}

rm -f "$work/commit" "$work/verdict"
mark running ""
run sources do_sources
run packages do_packages
run venv do_venv
run fetch do_fetch
[ ! -f "$work/commit" ] || commit=$(cat "$work/commit")
run secrets do_secrets
run converge do_converge
run check do_check
verdict=$(cat "$work/verdict")
stage="done"
mark "done" ""
echo "gpuenv bootstrap: done, gpuenv check verdict: $verdict (marker $marker)" | tee -a "$log"
