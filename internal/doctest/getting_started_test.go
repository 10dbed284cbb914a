package doctest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testedBlocks returns the bodies of the page's code blocks fenced as
// ```sh test, in order.
func testedBlocks(page string) []string {
	fence := regexp.MustCompile("(?ms)^```sh test\n(.*?)^```\n")
	var blocks []string
	for _, m := range fence.FindAllStringSubmatch(page, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// TestGettingStarted runs every ```sh test block of
// docs/getting-started.md, in order, as one bash script with -euo
// pipefail, from the repository's root: it builds the relay, migrates a
// throwaway database, starts the daemon, writes a committed and a
// rolled-back event with psql, reads them with a kcat consumer group,
// looks inside and stops the daemon. The script's only changes: HOME is
// a temporary directory, RELAY_DATABASE_URL the test's database, and the
// page's ports 9092 and 9464 free ones. The consumer must have read the
// committed event with its header, and nothing of the rolled-back one.
func TestGettingStarted(t *testing.T) {
	for _, tool := range []string{"bash", "psql", "curl", "kcat", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("docs/getting-started.md needs %s on PATH (.ci/run installs it): %v", tool, err)
		}
	}
	blocks := testedBlocks(read(t, "docs/getting-started.md"))
	if len(blocks) < 6 {
		t.Fatalf("docs/getting-started.md has %d ```sh test blocks; the tour has at least 6", len(blocks))
	}
	script := strings.Join(blocks, "\n")
	kafkaAddr, httpAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
	for _, addr := range []string{"127.0.0.1:9092", "127.0.0.1:9464"} {
		if !strings.Contains(script, addr) {
			t.Fatalf("the page's commands no longer use %s; update the test's port mapping", addr)
		}
	}
	script = strings.NewReplacer("127.0.0.1:9092", kafkaAddr, "127.0.0.1:9464", httpAddr).Replace(script)

	home := t.TempDir()
	goEnv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimSpace(string(goEnv)), "\n")
	env := append(os.Environ(), "HOME="+home, "RELAY_DATABASE_URL="+pgtest.NewDatabase(t),
		"GOCACHE="+vals[0], "GOMODCACHE="+vals[1], "GOPATH="+vals[2])

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	cmd.Env = env
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if err != nil {
		logTail, _ := os.ReadFile(filepath.Join(home, "relay-tour", "relay.log"))
		t.Fatalf("the page's commands failed: %v\nstdout:\n%s\nstderr:\n%s\nrelay.log:\n%s", err, stdout.String(), stderr.String(), logTail)
	}
	out := stdout.String()
	t.Logf("stdout:\n%s", out)
	if !regexp.MustCompile(`(?m)^order-42 \{"status":"paid"\} .*trace-id=abc`).MatchString(out) ||
		!strings.Contains(out, "relay-event-id=") {
		t.Errorf("kcat did not print the committed event order-42 with its headers; stdout:\n%s", out)
	}
	if strings.Contains(out, "order-43") {
		t.Errorf("the rolled-back event order-43 was published; stdout:\n%s", out)
	}
	if !strings.Contains(out, "tour-readers") {
		t.Errorf("relay groups did not list the group tour-readers; stdout:\n%s", out)
	}
}
