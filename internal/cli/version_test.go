package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/buildinfo"
	"github.com/outboxrelay/relay/internal/cli"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// mainOut runs the command line in process and returns its exit status
// and output.
func mainOut(name string, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := cli.MainWith(name, nil, args, cli.IO{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }})
	return code, stdout.String(), stderr.String()
}

// TestVersion: `version`, `--version` and `-v` print the name and
// version, then commit, build date, Go version and platform; --json the
// same as an object; relay-dev names itself.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-v"}} {
		code, out, errOut := mainOut("relay", args...)
		if code != 0 || !strings.HasPrefix(out, "relay "+buildinfo.Version+"\n") {
			t.Errorf("relay %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
		for _, want := range []string{"commit:", "build date:", "go:         " + runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH} {
			if !strings.Contains(out, want) {
				t.Errorf("relay %v does not print %q:\n%s", args, want, out)
			}
		}
	}
	code, out, _ := mainOut("relay", "version", "--json")
	var info buildinfo.Info
	if err := json.Unmarshal([]byte(out), &info); code != 0 || err != nil || info.Version != buildinfo.Version || info.GoVersion != runtime.Version() {
		t.Errorf("relay version --json: exit %d, %v, %+v", code, err, info)
	}
	if code, out, _ := mainOut("relay-dev", "--version"); code != 0 || !strings.HasPrefix(out, "relay-dev "+buildinfo.Version+"\n") {
		t.Errorf("relay-dev --version: exit %d, %q", code, out)
	}
	if code, _, errOut := mainOut("relay", "version", "extra"); code != 2 || !strings.Contains(errOut, "unexpected argument") {
		t.Errorf("relay version extra: exit %d, %q", code, errOut)
	}
}

// TestVersionSetAtLinkTime: the release build's -ldflags -X sets the
// version the binary prints, and the VCS stamp its commit.
func TestVersionSetAtLinkTime(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "relay")
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-buildvcs=auto", "-ldflags", "-X github.com/outboxrelay/relay/internal/buildinfo.Version=v9.8.7-test", "-o", bin, "./cmd/relay")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	res, err := testbin.Run(context.Background(), bin, nil, "version", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var info buildinfo.Info
	if err := json.Unmarshal([]byte(res.Stdout), &info); err != nil || info.Version != "v9.8.7-test" {
		t.Fatalf("relay version --json: %v, %q", err, res.Stdout)
	}
	// The go command stamps the commit of a clone (.git a directory), not
	// of a git worktree (.git a file) nor of a tree without git.
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Logf("not a git clone: the commit (%q) is not compared", info.Commit)
		return
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	if info.Commit != strings.TrimSpace(string(head)) {
		t.Errorf("commit %q, want HEAD %q", info.Commit, strings.TrimSpace(string(head)))
	}
}

// TestDoctorCommand: `relay doctor` with run's flags passes against the
// migrated test database and exits 0; the same with --json reports ok;
// against an unmigrated one it exits 1 naming `relay migrate up`; bad
// flags exit 2 as run's do.
func TestDoctorCommand(t *testing.T) {
	url, _ := pgtest.MigratedDatabase(t, "outbox")
	args := []string{"doctor", "--database-url", url, "--data-dir", t.TempDir(), "--kafka-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
	code, out, errOut := mainOut("relay", args...)
	if code != 0 || !strings.Contains(out, "all 8 checks passed") {
		t.Errorf("relay doctor: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = mainOut("relay", append(args, "--json")...)
	var report struct {
		OK     bool `json:"ok"`
		Checks []struct {
			Check, Status string
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &report); code != 0 || err != nil || !report.OK || len(report.Checks) != 8 {
		t.Errorf("relay doctor --json: exit %d, %v, %+v", code, err, report)
	}

	empty := pgtest.NewDatabase(t)
	code, out, errOut = mainOut("relay", "doctor", "--database-url", empty, "--data-dir", t.TempDir(), "--kafka-addr", "", "--http-addr", "")
	if code != 1 || !strings.Contains(out, "FAIL  schema") || !strings.Contains(out, "relay migrate up") || !strings.Contains(errOut, "checks failed") {
		t.Errorf("relay doctor on an unmigrated database: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := mainOut("relay", "doctor", "--source", "kafka"); code != 2 || !strings.Contains(errOut, "--source") {
		t.Errorf("relay doctor --source kafka: exit %d, %q", code, errOut)
	}
}
