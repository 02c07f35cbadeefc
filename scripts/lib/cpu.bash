# Sourced by scripts/test.sh and scripts/package.sh: the CPU time their
# steps take, beside the wall-clock time they print. On CI's two cores the
# steps run side by side, so a step's seconds say little about what it
# costs; its CPU seconds do.
#
#   cpu_ticks         REPLY: "U S", the user and system CPU time, in clock
#                     ticks, of the children of this shell (or subshell)
#                     that have ended and been waited for (/proc's cutime
#                     and cstime)
#   cpu_since U S     REPLY: "N s user, M s system" since cpu_ticks gave U S
#   step_report WHAT T U S
#                     prints "$step_prefix: WHAT took N s (CPU: ...)" on
#                     stderr, N and the CPU time since SECONDS was T and
#                     cpu_ticks gave U S
#   step_start        starts a step: its seconds and CPU time count from here
#   took WHAT         reports the step since step_start (or the last took),
#                     and starts the next
# The caller sets step_prefix ("tpuhal test").
# cpu_ticks does not fork: a subshell would read its own children's time.
cpu_ticks() {
  local stat f
  read -r stat </proc/"$BASHPID"/stat
  read -ra f <<<"${stat##*) }"  # the fields after the command's name (which may hold spaces), from the 3rd
  REPLY="${f[13]} ${f[14]}"
}
cpu_since() {
  local u s tick
  cpu_ticks
  read -r u s <<<"$REPLY"
  tick=$(getconf CLK_TCK)
  REPLY="$(((u - $1) / tick)) s user, $(((s - $2) / tick)) s system"
}
step_start() {
  step=$SECONDS
  cpu_ticks
  step_cpu=$REPLY
}
step_report() {
  cpu_since "$3" "$4"
  echo "${step_prefix:?}: $1 took $((SECONDS - $2)) s (CPU: $REPLY)" >&2
}
took() {
  # shellcheck disable=SC2086 # step_cpu: two numbers
  step_report "$1" "$step" $step_cpu
  step_start
}
