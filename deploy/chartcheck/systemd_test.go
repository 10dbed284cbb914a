package chartcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// unitOptions parses a systemd unit: section.Key to its values, in order.
func unitOptions(t *testing.T, data string) map[string][]string {
	t.Helper()
	opts := map[string][]string{}
	section := ""
	for i, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("relay.service line %d: %q is not Key=value in a section", i+1, line)
			}
			opts[section+"."+k] = append(opts[section+"."+k], v)
		}
	}
	return opts
}

// TestSystemdUnit checks deploy/systemd/relay.service: systemd-analyze
// verify accepts it without a warning (with ExecStart pointed at a freshly
// built relay), it carries the hardening options and limits the relay
// needs, its stop timeout outlasts the relay's graceful drain, and its
// flags are the relay's.
func TestSystemdUnit(t *testing.T) {
	path := filepath.Join(repoRoot, "deploy", "systemd", "relay.service")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	opts := unitOptions(t, string(data))
	for key, want := range map[string]string{
		"Service.DynamicUser":             "yes",
		"Service.StateDirectory":          "relay",
		"Service.ProtectSystem":           "strict",
		"Service.ProtectHome":             "yes",
		"Service.NoNewPrivileges":         "yes",
		"Service.PrivateTmp":              "yes",
		"Service.PrivateDevices":          "yes",
		"Service.RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"Service.SystemCallFilter":        "@system-service",
		"Service.MemoryDenyWriteExecute":  "yes",
		"Service.Restart":                 "on-failure",
		"Service.EnvironmentFile":         "/etc/relay/relay.env",
		"Service.CapabilityBoundingSet":   "",
		"Install.WantedBy":                "multi-user.target",
	} {
		if got := opts[key]; len(got) != 1 || got[0] != want {
			t.Errorf("relay.service: %s = %q, want %q", key, got, want)
		}
	}
	if n := opts["Service.LimitNOFILE"]; len(n) != 1 || len(n[0]) < 5 {
		t.Errorf("relay.service: LimitNOFILE %q is not sized for thousands of partitions", n)
	}
	exec0 := opts["Service.ExecStart"]
	if len(exec0) != 1 {
		t.Fatalf("relay.service: ExecStart %q", exec0)
	}
	argv := strings.Fields(exec0[0])
	if argv[0] != "/usr/local/bin/relay" {
		t.Errorf("relay.service: ExecStart runs %s", argv[0])
	}
	_, flags := checkRelayArgs(t, "relay.service ExecStart", argv[1:], nil)
	if flags["data-dir"] != "/var/lib/relay" {
		t.Errorf("relay.service: --data-dir %q is not the StateDirectory /var/lib/relay", flags["data-dir"])
	}
	for _, a := range argv {
		if strings.Contains(a, "postgres://") || strings.HasPrefix(a, "--database-url") || strings.Contains(a, "password") {
			t.Errorf("relay.service: a secret on the command line: %s", a)
		}
	}
	drain, err := time.ParseDuration(flags["shutdown-timeout"])
	if err != nil {
		t.Fatalf("relay.service: --shutdown-timeout %q: %v", flags["shutdown-timeout"], err)
	}
	stop, err := time.ParseDuration(strings.Join(opts["Service.TimeoutStopSec"], ""))
	if err != nil || stop <= drain {
		t.Errorf("relay.service: TimeoutStopSec %q is not longer than --shutdown-timeout %s", opts["Service.TimeoutStopSec"], drain)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze (Debian package systemd) is needed to verify the unit: %v", err)
	}
	// The unit as installed, but running the relay just built: verify
	// checks that ExecStart's program exists.
	dir := t.TempDir()
	unit := filepath.Join(dir, "relay.service")
	if err := os.WriteFile(unit, []byte(strings.Replace(string(data), "ExecStart=/usr/local/bin/relay ", "ExecStart="+relayBinary(t)+" ", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", "--man=no", unit)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v; it must accept the unit without a word:\n%s", err, out)
	}
}
