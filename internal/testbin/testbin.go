// Package testbin builds the relay binaries once per test process, so tests
// can run, signal and SIGKILL the real thing, and runs them to completion.
// It also builds the previous release (release/RELEASES) from git history,
// for upgrade tests.
package testbin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
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
	cmd := exec.Command("go", "build", "-o", path, "./cmd/"+name)
	cmd.Dir = repoRoot()
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

// Release is a relay binary of an earlier release, built from git history.
type Release struct {
	Version string
	Commit  string
	Path    string
}

// Releases reads release/RELEASES: the recorded releases, oldest first.
func Releases() ([]Release, error) {
	path := filepath.Join(repoRoot(), "release", "RELEASES")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Release
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 || !commitPattern.MatchString(f[1]) || !versionPattern.MatchString(f[0]) {
			return nil, fmt.Errorf("%s:%d: want \"vX.Y.Z <40-hex commit> <YYYY-MM-DD>\", got %q", path, i+1, line)
		}
		if _, err := time.Parse(time.DateOnly, f[2]); err != nil {
			return nil, fmt.Errorf("%s:%d: release date: %w", path, i+1, err)
		}
		out = append(out, Release{Version: f[0], Commit: f[1]})
	}
	return out, nil
}

var (
	commitPattern  = regexp.MustCompile(`^[0-9a-f]{40}$`)
	versionPattern = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)
)

// PreviousRelease returns the newest recorded release's relay binary,
// built from its commit in this clone's history. The binary is cached
// under the user's cache directory, keyed by the commit, so later runs
// reuse it. A commit missing from the clone (a shallow clone) fails the
// test: fetch the history (git fetch --unshallow).
func PreviousRelease(t testing.TB) Release {
	t.Helper()
	releases, err := Releases()
	if err != nil {
		t.Fatalf("testbin: %v", err)
	}
	if len(releases) == 0 {
		t.Fatal("testbin: release/RELEASES records no release")
	}
	rel := releases[len(releases)-1]
	prevMu.Lock()
	defer prevMu.Unlock()
	rel.Path, err = buildRelease(rel.Commit)
	if err != nil {
		t.Fatalf("testbin: building %s: %v", rel.Version, err)
	}
	return rel
}

var prevMu sync.Mutex

func buildRelease(commit string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		// No $HOME (some CI runners): the temp dir still serves reruns.
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "relay-releases", commit)
	path := filepath.Join(dir, "relay")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	root := repoRoot()
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("commit %s is not in this clone (%v: %s); fetch the whole history, e.g. git fetch --unshallow", commit, err, bytes.TrimSpace(out))
	}
	src, err := os.MkdirTemp("", "relay-release-src-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(src)
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", err
	}
	untar.Stdin = pipe
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return "", err
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return "", fmt.Errorf("git archive %s: %w: %s", commit, err, archiveErr.Bytes())
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("unpacking %s: %w: %s", commit, err, untarErr.Bytes())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := path + fmt.Sprintf(".%d.tmp", os.Getpid())
	build := exec.Command("go", "build", "-o", tmp, "./cmd/relay")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build ./cmd/relay at %s: %w\n%s", commit, err, out)
	}
	return path, os.Rename(tmp, path)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
