// Package testbin builds the relay binaries once per test process, so tests
// can run, signal and SIGKILL the real thing, and runs them to completion.
package testbin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

type binary struct {
	once sync.Once
	path string
	err  error
}

var (
	mu   sync.Mutex
	dir  string
	bins = map[string]*binary{}
)

// Relay returns the path of a freshly built relay binary (cmd/relay). The
// first call builds it; Cleanup removes it. The binary is built without
// the race detector: crash and end-to-end tests drive it hard and
// in-process tests already run under -race.
func Relay(t testing.TB) string {
	t.Helper()
	return get(t, "relay")
}

// RelayDev is Relay for the development binary (cmd/relay-dev): the
// relay's commands, demo and bench.
func RelayDev(t testing.TB) string {
	t.Helper()
	return get(t, "relay-dev")
}

// Cleanup removes the built binaries. Call it from TestMain after the tests.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
	}
}

func get(t testing.TB, name string) string {
	t.Helper()
	mu.Lock()
	b := bins[name]
	if b == nil {
		b = &binary{}
		bins[name] = b
	}
	mu.Unlock()
	b.once.Do(func() { b.path, b.err = build(name) })
	if b.err != nil {
		t.Fatalf("testbin: %v", b.err)
	}
	return b.path
}

func build(name string) (string, error) {
	mu.Lock()
	if dir == "" {
		d, err := os.MkdirTemp("", "relay-bin-*")
		if err != nil {
			mu.Unlock()
			return "", err
		}
		dir = d
	}
	path := filepath.Join(dir, name)
	mu.Unlock()
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", path, "./cmd/"+name)
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %w\n%s", name, err, out)
	}
	return path, nil
}

// Result is a finished run of a binary.
type Result struct {
	Stdout, Stderr string
	// Code is the exit status; -1 when a signal ended the process.
	Code int
}

// Run runs bin with args until it exits or ctx ends (which kills it). env,
// when not nil, is its whole environment; nil inherits this process's. A
// non-zero exit is a Result; the error is for a binary that could not run.
func Run(ctx context.Context, bin string, env []string, args ...string) (Result, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	if exit, ok := err.(*exec.ExitError); ok {
		res.Code, err = exit.ExitCode(), nil
	}
	return res, err
}
