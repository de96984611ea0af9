# Sourced by the scripts: is this a CI run? The same rule as tests/_ci.py's in_ci() (the suite's
# tests/core/test_ci_rule.py checks that both agree): CI set to anything but 0, false, no or off
# (any case, blanks ignored) counts. CI services set "true", some set "1".
is_ci() {
  local value="${CI:-}"
  value="${value#"${value%%[![:space:]]*}"}"
  value="${value%"${value##*[![:space:]]}"}"
  case "${value,,}" in
    "" | 0 | false | no | off) return 1 ;;
    *) return 0 ;;
  esac
}
