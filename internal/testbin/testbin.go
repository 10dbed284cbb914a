// Package testbin builds the relay binary once per test process, so tests
// can run, signal and SIGKILL the real thing.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	once sync.Once
	path string
	dir  string
	err  error
)

// Relay returns the path of a freshly built relay binary. The first call
// builds it; Cleanup removes it. The binary is built without the race
// detector: crash and end-to-end tests drive it hard and in-process tests
// already run under -race.
func Relay(t testing.TB) string {
	t.Helper()
	once.Do(build)
	if err != nil {
		t.Fatalf("testbin: %v", err)
	}
	return path
}

// Cleanup removes the built binary. Call it from TestMain after the tests.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

func build() {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir, err = os.MkdirTemp("", "relay-bin-*")
	if err != nil {
		return
	}
	path = filepath.Join(dir, "relay")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/relay")
	cmd.Dir = root
	if out, buildErr := cmd.CombinedOutput(); buildErr != nil {
		err = fmt.Errorf("go build ./cmd/relay: %w\n%s", buildErr, out)
	}
}
