# Sourced by the systemctl shim: the units it runs for real (GPUPROV_SHIM_REAL_UNITS, comma-separated names
# without .service), read as systemd reads them.
#   unit file:   ${GPUPROV_SYSROOT}/etc/systemd/system/U.service, else .../lib/systemd/system/U.service or
#                .../usr/lib/systemd/system/U.service (a package the apt shim installed lays its unit there)
#   drop-ins:    ${GPUPROV_SYSROOT}/etc/systemd/system/U.service.d/*.conf, in name order, after the unit file
#   [Service]:   ExecStart= and EnvironmentFile= are lists (an empty assignment resets them, and a unit that is
#                not oneshot may have one ExecStart only), Environment=, User=, Type= (simple or oneshot)
#   ExecStart:   $VAR is the variable split into words, ${VAR} one word, as systemd expands them; an absolute
#                path outside the sysroot that is not on this machine is looked up by name on PATH (the
#                shims' dcgm-exporter, nv-hostengine); User= other than root runs it with that user's uid/gid
#   paths in EnvironmentFile= are read under the sysroot; a leading "-" makes a missing file no error
# Runtime: $SHIM_RUN/units/U.pid (the main process), U.log (its output); a reboot clears $SHIM_RUN and kills
# every process of the host, as a real reboot would.
# shellcheck shell=bash

shim_real_unit() {
  case ",${GPUPROV_SHIM_REAL_UNITS:-}," in *",${1%.service},"*) return 0 ;; *) return 1 ;; esac
}

# shim_unit_file U: the unit's file under the sysroot (prints it), or fails as systemd says it
shim_unit_file() {
  local u="${1%.service}" dir
  for dir in etc/systemd/system lib/systemd/system usr/lib/systemd/system; do
    if [ -f "${GPUPROV_SYSROOT:-}/$dir/$u.service" ]; then
      printf '%s\n' "${GPUPROV_SYSROOT:-}/$dir/$u.service"
      return 0
    fi
  done
  echo "Failed to start $u.service: Unit $u.service not found." >&2
  return 1
}

# shim_unit_settings U: "KEY=VALUE" lines of its [Service] section, unit file then drop-ins, lists resolved
shim_unit_settings() {
  local u="${1%.service}" file dropin
  file="$(shim_unit_file "$u")" || return 1
  {
    cat "$file"
    for dropin in "${GPUPROV_SYSROOT:-}/etc/systemd/system/$u.service.d/"*.conf; do
      if [ -f "$dropin" ]; then cat "$dropin"; fi
    done
  } | awk '
    /^\[/ { service = ($0 == "[Service]"); next }
    !service || /^[ \t]*(#|;|$)/ { next }
    {
      key = $0; sub(/=.*/, "", key); value = $0; sub(/^[^=]*=/, "", value)
      if (key == "ExecStart" || key == "EnvironmentFile" || key == "Environment") {
        if (value == "") { delete list[key]; count[key] = 0; next }
        list[key, ++count[key]] = value
      } else single[key] = value
    }
    END {
      for (k in single) print k "=" single[k]
      n = split("ExecStart EnvironmentFile Environment", keys, " ")
      for (i = 1; i <= n; i++) for (j = 1; j <= count[keys[i]]; j++) if ((keys[i], j) in list) print keys[i] "=" list[keys[i], j]
    }'
}

shim_unit_running() {
  local pid
  pid="$(cat "$SHIM_RUN/units/${1%.service}.pid" 2>/dev/null)" || return 1
  kill -0 "$pid" 2>/dev/null
}

# shim_unit_env FILE...: KEY=VALUE lines of systemd EnvironmentFiles (quotes taken off, comments skipped)
shim_unit_envfile() {
  local path="$1" optional=0 line key value
  case "$path" in -*) optional=1; path="${path#-}" ;; esac
  if [ ! -r "${GPUPROV_SYSROOT:-}$path" ]; then
    [ "$optional" = 1 ] && return 0
    echo "Failed to load environment files: No such file or directory ($path)" >&2
    return 1
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in "" | "#"* | ";"*) continue ;; esac
    key="${line%%=*}"
    value="${line#*=}"
    case "$value" in \"*\") value="${value:1:${#value}-2}" ;; \'*\') value="${value:1:${#value}-2}" ;; esac
    printf '%s=%s\n' "$key" "$value"
  done <"${GPUPROV_SYSROOT:-}$path"
}

shim_unit_start() {
  local u="${1%.service}" settings type user exec execs=() envs=() line word words=() argv=() more=() bin name var pid value
  shim_unit_running "$u" && return 0
  settings="$(shim_unit_settings "$u")" || return 1
  type="$(sed -n 's/^Type=//p' <<<"$settings" | tail -n 1)"
  user="$(sed -n 's/^User=//p' <<<"$settings" | tail -n 1)"
  mapfile -t execs < <(sed -n 's/^ExecStart=//p' <<<"$settings")
  if [ "${#execs[@]}" -ne 1 ] && [ "${type:-simple}" != oneshot ]; then
    echo "$u.service: Service has more than one ExecStart= setting, which is only allowed for Type=oneshot services. Refusing." >&2
    return 1
  fi
  [ "${#execs[@]}" -ge 1 ] || { echo "$u.service: Service has no ExecStart= setting. Refusing." >&2; return 1; }
  while IFS= read -r line; do
    case "$line" in
      EnvironmentFile=*) while IFS= read -r var; do envs+=("$var"); done < <(shim_unit_envfile "${line#EnvironmentFile=}") ;;
      Environment=*) value="${line#Environment=}"; value="${value#\"}"; envs+=("${value%\"}") ;;
    esac
  done <<<"$settings"
  mkdir -p "$SHIM_RUN/units"
  for exec in "${execs[@]}"; do
    argv=()
    read -r -a words <<<"$exec"
    for word in "${words[@]}"; do
      if [[ "$word" =~ ^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$ ]]; then
        argv+=("$(shim_unit_lookup "${BASH_REMATCH[1]}" "${envs[@]}")")
      elif [[ "$word" =~ ^\$([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
        read -r -a more <<<"$(shim_unit_lookup "${BASH_REMATCH[1]}" "${envs[@]}")"
        argv+=("${more[@]}")
      else
        argv+=("$word")
      fi
    done
    bin="${argv[0]#[-@:+!]}"
    if [ -x "${GPUPROV_SYSROOT:-}$bin" ]; then bin="${GPUPROV_SYSROOT:-}$bin"
    elif [ ! -x "$bin" ]; then
      name="$(command -v "$(basename "$bin")" || true)"
      [ -n "$name" ] || { echo "$u.service: Failed to locate executable $bin: No such file or directory" >&2; return 1; }
      bin="$name"
    fi
    argv[0]="$bin"
    if [ -n "$user" ] && [ "$user" != root ]; then
      id "$user" >/dev/null 2>&1 || { echo "$u.service: Failed to determine user credentials: No such process" >&2; return 1; }
      argv=(setpriv --reuid="$user" --regid="$user" --init-groups -- "${argv[@]}")
    fi
    if [ "${type:-simple}" = oneshot ]; then
      env "${envs[@]}" "${argv[@]}" >>"$SHIM_RUN/units/$u.log" 2>&1 </dev/null || {
        echo "Job for $u.service failed because the control process exited with error code." >&2
        return 1
      }
    else
      setsid env "${envs[@]}" "${argv[@]}" >>"$SHIM_RUN/units/$u.log" 2>&1 </dev/null &
      pid=$!
      printf '%s\n' "$pid" >"$SHIM_RUN/units/$u.pid"
      sleep 0.2
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "Job for $u.service failed because the control process exited with error code." >&2
        return 1
      fi
    fi
  done
}

# shim_unit_lookup NAME KEY=VALUE...: NAME's value among the unit's environment (the last one wins)
shim_unit_lookup() {
  local name="$1" kv value=""
  shift
  for kv in "$@"; do
    if [ "${kv%%=*}" = "$name" ]; then value="${kv#*=}"; fi
  done
  printf '%s' "$value"
}

shim_unit_stop() {
  local u="${1%.service}" pid n
  pid="$(cat "$SHIM_RUN/units/$u.pid" 2>/dev/null)" || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for n in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      [ "$n" = 50 ] && kill -KILL "$pid" 2>/dev/null
      sleep 0.1
    done
  fi
  rm -f "$SHIM_RUN/units/$u.pid"
}
