#!/bin/sh
# Verbs baked into every journey image (the journey is $CORTEX_JOURNEY, set at build time):
#   train     the journey's default config; the local backend unless a connection file is
#             mounted at /run/cortex/connection.json (or named by $CORTEX_CONNECTION_FILE)
#   smoke     the journey's smoke command; exits non-zero on failure
#   validate  the offline recipe validator and the model catalog validator
#   shell     an interactive shell in the image
# Extra arguments after train/smoke are key=value overrides for the journey's entry point.
set -eu
verb="${1:-train}"
if [ "$#" -gt 0 ]; then shift; fi
case "$verb" in
  train|smoke)
    exec cortex-recipes journey "$verb" "$CORTEX_JOURNEY" "$@" --root /app ;;
  validate)
    cortex-recipes validate --root /app
    exec cortex-recipes catalog validate --root /app ;;
  shell)
    exec /bin/bash "$@" ;;
  *)
    echo "unknown verb '$verb'; use train, smoke, validate or shell" >&2
    exit 64 ;;
esac
