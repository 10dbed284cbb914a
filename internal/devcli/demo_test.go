package devcli_test

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/testbin"
)

// TestDemo runs `relay-dev demo` as a user would: events are consumed within
// 60 s (a loaded CI machine is slow to start PostgreSQL and join a group), and Ctrl-C stops everything and removes its files.
func TestDemo(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(testbin.RelayDev(t), "demo", "--kafka-addr", e2e.FreeAddr(t), "--http-addr", e2e.FreeAddr(t), "--interval", "100ms")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var out []string
	var dirs []string
	dirLine := regexp.MustCompile(`^(?:PostgreSQL|embedded broker) files: (.+)$`)
	consumed := 0
	deadline := time.After(60 * time.Second)
	for consumed < 5 {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("demo exited early:\n%s", strings.Join(out, "\n"))
			}
			out = append(out, line)
			if m := dirLine.FindStringSubmatch(line); m != nil {
				dirs = append(dirs, m[1])
			}
			if strings.HasPrefix(line, "consumed orders/") && strings.Contains(line, "event-id=") {
				consumed++
			}
		case <-deadline:
			t.Fatalf("fewer than 5 events consumed within 60 s:\n%s", strings.Join(out, "\n"))
		}
	}
	if len(dirs) != 2 {
		t.Fatalf("the demo did not name its directories:\n%s", strings.Join(out, "\n"))
	}
	cmd.Process.Signal(syscall.SIGINT)
	for line := range lines {
		out = append(out, line)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("demo after Ctrl-C: %v\n%s", err, strings.Join(out, "\n"))
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists after the demo stopped", d)
		}
	}
	if !strings.Contains(strings.Join(out, "\n"), "kcat -b") {
		t.Error("the demo did not print the kcat command")
	}
}
