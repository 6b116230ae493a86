#!/usr/bin/env bash
# Tries the built bundle on a display (run it under a virtual one, see below): its version and size, the
# smoke test on the real X11 platform plugin, the time from launch to a visible window, and one chat with
# the starter model, saved as a screenshot. Uses a throwaway profile (settings, conversations); the model
# cache is the usual one, so the starter must have been fetched once (`redline models pull starter`).
#
#   xvfb-run -a -s "-screen 0 1400x900x24" packaging/try_bundle.sh [BUNDLE_DIR] [SCREENSHOT.png]
#
# Needs xdotool, ImageMagick (import) and sqlite3.
set -euo pipefail
BUNDLE=${1:-dist/redline}
SHOT=${2:-docs/screenshots/bundle-chat.png}
QUESTION="What is the capital of France? Answer in one sentence."
EXE="$BUNDLE/redline"
: "${DISPLAY:?run this under a display, e.g. xvfb-run -a -s \"-screen 0 1400x900x24\" $0}"

echo "version: $("$EXE" --version)"
echo "bundle size: $(du -sh "$BUNDLE" | cut -f1) ($(find "$BUNDLE" -type f | wc -l) files)"

PROFILE=$(mktemp -d)
APP=""
cleanup() { [ -n "$APP" ] && kill "$APP" 2>/dev/null; rm -rf "$PROFILE"; }
trap cleanup EXIT
export XDG_CONFIG_HOME=$PROFILE/config XDG_DATA_HOME=$PROFILE/data HF_HUB_OFFLINE=1 QT_QPA_PLATFORM=xcb
echo "smoke test (xcb): $("$EXE" --smoke-test 2>/dev/null | tail -1)"

mkdir -p "$XDG_CONFIG_HOME/redline"
echo '{"model": "starter", "temperature": 0, "max_new_tokens": 40}' > "$XDG_CONFIG_HOME/redline/settings.json"
DB=$XDG_DATA_HOME/redline/conversations.sqlite3
count() { sqlite3 "$DB" "$1" 2>/dev/null || echo 0; }

start=$(date +%s.%N)
"$EXE" > "$PROFILE/app.log" 2>&1 &
APP=$!
WID=$(xdotool search --sync --onlyvisible --name 'Redline' | head -1)
visible=$(date +%s.%N)
echo "launch → window visible: $(echo "$visible - $start" | bc | sed 's/^\./0./') s"

xdotool windowfocus --sync "$WID"
xdotool type --delay 15 "$QUESTION"
# Enter sends once the model has loaded; before that the text stays in the box, so keep pressing it
# until the message is in the database.
for _ in $(seq 120); do
    xdotool key --window "$WID" Return
    sleep 2
    [ "$(count "select count(*) from messages where role='user'")" -ge 1 ] && break
done
echo "sent after: $(echo "$(date +%s.%N) - $start" | bc | sed 's/^\./0./') s"
for _ in $(seq 150); do
    [ "$(count "select count(*) from messages where role='assistant' and partial=0")" -ge 1 ] && break
    sleep 2
done
sleep 1  # the last render
echo "reply: $(count "select content from messages where role='assistant'")"
echo "stats: $(count "select stats from messages where role='assistant'")"
mkdir -p "$(dirname "$SHOT")"
import -window "$WID" -strip "png:$SHOT"
echo "screenshot: $SHOT ($(du -h "$SHOT" | cut -f1))"
