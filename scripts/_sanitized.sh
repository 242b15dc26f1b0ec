# Sourced by native-tests.sh and unprivileged-tests.sh: the native keeper built
# with AddressSanitizer and UBSan, and the check that it reported nothing.
#   sanitized_build DIR [PYTHON]
#                         -> DIR/tether-keeper, DIR/tether-shell and DIR/tether
#                            (the native front ends, with PYTHON's tether-shell-py
#                            and tether-py beside them, to hand over to),
#                            DIR/reports (world-writable, sticky)
#   sanitized_env DIR     -> the environment (one NAME=VALUE per line) that makes
#                            tether run that keeper and send reports to files
#                            (the keeper's stderr is /dev/null)
#   sanitized_check DIR   -> fails, printing them, if there are any reports

sanitized_build() {
  local dir="$1" cc="${CC:-cc}"
  if ! command -v "$cc" >/dev/null; then
    echo "no C compiler ($cc): the sanitizer run needs one" >&2
    return 1
  fi
  "$cc" -std=gnu11 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -pthread \
    -fno-sanitize-recover=all -Wall -Wextra -Werror -o "$dir/tether-keeper" \
    src/tether/_native/keeper.c
  "$cc" -std=gnu11 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -pthread \
    -fno-sanitize-recover=all -Wall -Wextra -Werror -o "$dir/tether-shell" \
    src/tether/_native/shell.c
  local bindir
  bindir=$(dirname "$("${2:-python3}" -c 'import sys; print(sys.executable)')")
  cp "$bindir/tether-shell-py" "$dir/tether-shell-py"
  cp "$dir/tether-shell" "$dir/tether"  # the same program: `tether run` when named so
  cp "$bindir/tether-py" "$dir/tether-py"
  mkdir -p "$dir/reports"
  chmod 1777 "$dir/reports"
  chmod a+rx "$dir" "$dir/tether-keeper" "$dir/tether-shell" "$dir/tether-shell-py" \
    "$dir/tether" "$dir/tether-py"
}

sanitized_env() {
  local dir="$1"
  echo "_TETHER_NATIVE_HELPER=$dir/tether-keeper"
  echo "_TETHER_TEST_NATIVE_SHELL=$dir/tether-shell"
  echo "_TETHER_TEST_NATIVE_CLI=$dir/tether"
  echo "ASAN_OPTIONS=log_path=$dir/reports/asan:detect_leaks=0:abort_on_error=1"
  echo "UBSAN_OPTIONS=log_path=$dir/reports/ubsan:print_stacktrace=1:halt_on_error=1"
}

sanitized_check() {
  local dir="$1"
  if [ -n "$(ls -A "$dir/reports")" ]; then
    echo "the sanitizers reported:" >&2
    cat "$dir/reports"/* >&2
    return 1
  fi
  echo "no sanitizer reports"
}
