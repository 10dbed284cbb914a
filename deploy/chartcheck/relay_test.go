package chartcheck

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// repoRoot is the relay repository, two levels above this package.
const repoRoot = "../.."

var relayBin struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// relayBinary builds cmd/relay of the enclosing module once per test run.
func relayBinary(t *testing.T) string {
	t.Helper()
	relayBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "chartcheck-relay-")
		if err != nil {
			relayBin.err = err
			return
		}
		relayBin.path = filepath.Join(dir, "relay")
		cmd := exec.Command("go", "build", "-o", relayBin.path, "./cmd/relay")
		// As internal/testbin builds it, so that after the relay's own
		// tests (.ci/run) the build is in the cache.
		cmd.Dir = repoRoot
		relayBin.out, relayBin.err = cmd.CombinedOutput()
	})
	if relayBin.err != nil {
		t.Fatalf("building the relay: %v\n%s", relayBin.err, relayBin.out)
	}
	return relayBin.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if relayBin.path != "" {
		os.RemoveAll(filepath.Dir(relayBin.path))
	}
	os.Exit(code)
}

var (
	flagsMu    sync.Mutex
	flagsCache = map[string]map[string]bool{}
)

// relayFlags are the flags of `relay <command...>`, read from its -h.
func relayFlags(t *testing.T, command ...string) map[string]bool {
	t.Helper()
	key := strings.Join(command, " ")
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if f, ok := flagsCache[key]; ok {
		return f
	}
	cmd := exec.Command(relayBinary(t), append(command, "-h")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("relay %s -h: %v\n%s", key, err, out)
	}
	flags := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "  -") {
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "  -"), " ")
			flags[name] = true
		}
	}
	if len(flags) == 0 {
		t.Fatalf("relay %s -h lists no flags:\n%s", key, out)
	}
	flagsCache[key] = flags
	return flags
}

// commandPath is the subcommand words of a relay command line, before its
// first flag, and the flags as name to value ("true" for a bare boolean).
func commandPath(args []string) (path []string, flags map[string]string) {
	flags = map[string]string{}
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			if len(flags) == 0 && i == len(path) {
				path = append(path, a)
			}
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			value = "true"
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				value = args[i+1]
			}
		}
		flags[name] = value
	}
	return path, flags
}

// checkRelayArgs fails for a flag or a RELAY_* variable the relay command
// does not have.
func checkRelayArgs(t *testing.T, where string, args []string, env []string) (path []string, flags map[string]string) {
	t.Helper()
	path, flags = commandPath(args)
	if len(path) == 0 {
		t.Errorf("%s: no relay command in %q", where, args)
		return nil, flags
	}
	known := relayFlags(t, path...)
	for name := range flags {
		if !known[name] {
			t.Errorf("%s: relay %s has no flag --%s", where, strings.Join(path, " "), name)
		}
	}
	for _, e := range env {
		if !strings.HasPrefix(e, "RELAY_") {
			continue
		}
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(e, "RELAY_"), "_", "-"))
		if !known[name] {
			t.Errorf("%s: %s names no flag of relay %s", where, e, strings.Join(path, " "))
		}
	}
	return path, flags
}
