#!/usr/bin/env bash
# Regenerates the web UI's screenshots in docs/ui/ (jobs, a job's page, the history, the GPU
# grid, queue and policy): the browser tests (tests/web/check_ui.py, run by the e2e tests
# web::the_web_ui_in_headless_chromium_against_kairos_up against a fresh `kairos up`, and
# web::the_history_page_in_headless_chromium_lists_jobs_past_the_retention), saving each view
# as they check it. Needs what scripts/test.sh installs (chromium, chromedriver,
# Selenium under target/tools).
set -euo pipefail
cd "$(dirname "$0")/.."
export KAIROS_TEST_PYTHON="${KAIROS_TEST_PYTHON:-$PWD/target/tools/moto/bin/python}"
export KAIROS_UI_SCREENSHOTS="$PWD/docs/ui"
mkdir -p "$KAIROS_UI_SCREENSHOTS"
cargo build --bins --locked
cargo test -p kairos-cli --test e2e --locked -- --exact --test-threads 1 \
  web::the_web_ui_in_headless_chromium_against_kairos_up \
  web::the_history_page_in_headless_chromium_lists_jobs_past_the_retention
ls -l "$KAIROS_UI_SCREENSHOTS"
