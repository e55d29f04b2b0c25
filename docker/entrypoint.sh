#!/bin/sh
# Verbs baked into every journey image (the journey is $CORTEX_JOURNEY, set at build time):
#   train     the journey's default config; the local backend unless a connection file is
#             mounted at /run/cortex/connection.json (or named by $CORTEX_CONNECTION_FILE)
#   smoke     the journey's smoke command; exits non-zero on failure
#   qualify   the journey's qualification for the profile of the hardware it finds (or
#             profile=<name>): the run folders and the evidence record go under /out
#   validate  the offline recipe validator and the model catalog validator
#   shell     an interactive shell in the image
# Extra arguments after train/smoke/qualify are key=value overrides for the journey's module.
#
# /out: when a writable directory is mounted there, runs go to /out/runs (train, smoke,
# qualify) and evidence to /out/evidence (qualify). Files belong to the user the container runs
# as: pass `--user "$(id -u):$(id -g)"`, or start it as root (`--user 0`) and the entrypoint
# drops to the owner of /out (or to $CORTEX_UID:$CORTEX_GID) before running anything.
set -eu
OUT="${CORTEX_OUT:-/out}"  # /out in an image; tests point it elsewhere
if [ "$(id -u)" = 0 ] && [ -d "$OUT" ] && [ -z "${CORTEX_DROPPED:-}" ]; then
  uid="${CORTEX_UID:-$(stat -c %u "$OUT")}"
  gid="${CORTEX_GID:-$(stat -c %g "$OUT")}"
  if [ "$uid" != 0 ]; then
    export CORTEX_DROPPED=1 HOME=/tmp
    exec setpriv --reuid "$uid" --regid "$gid" --clear-groups "$0" "$@"
  fi
fi
if [ ! -w "${HOME:-/nonexistent}" ]; then
  export HOME=/tmp  # an arbitrary --user has no home of its own in the image
fi

verb="${1:-train}"
if [ "$#" -gt 0 ]; then shift; fi
out_writable=""
if [ -d "$OUT" ] && [ -w "$OUT" ]; then
  out_writable=1
  export CORTEX_RECIPES_RUNS="$OUT/runs"
fi
case "$verb" in
  train|smoke)
    exec cortex-recipes journey "$verb" "$CORTEX_JOURNEY" "$@" --root /app ;;
  qualify)
    if [ -z "$out_writable" ]; then
      echo "qualify writes its record under $OUT: mount a directory you own there, e.g." \
           "docker run --rm --user \"\$(id -u):\$(id -g)\" -v \"\$PWD/out:/out\" <image> qualify" >&2
      exit 64
    fi
    profile=auto
    for arg in "$@"; do
      case "$arg" in profile=*) profile="${arg#profile=}" ;; esac
    done
    overrides=""
    for arg in "$@"; do
      case "$arg" in profile=*) ;; *) overrides="$overrides $arg" ;; esac
    done
    # shellcheck disable=SC2086  # overrides are key=value words without spaces
    exec cortex-recipes qualify "$CORTEX_JOURNEY" "$profile" $overrides --root /app --out "$OUT" ;;
  validate)
    cortex-recipes validate --root /app
    exec cortex-recipes catalog validate --root /app ;;
  shell)
    exec /bin/bash "$@" ;;
  *)
    echo "unknown verb '$verb'; use train, smoke, qualify, validate or shell" >&2
    exit 64 ;;
esac
