package release_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testbin"
)

// TestBuildIsReproducible runs build.sh for linux/amd64 in two clones of
// the same commit at different paths and compares their SHA256SUMS: the
// binaries must be byte for byte the same (no path, time or environment
// leaks into them). The second build shares the first's build cache, so
// it costs a link; the first costs a full CGO_ENABLED=0 build the first
// time the cache sees it.
func TestBuildIsReproducible(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	root := repoRoot(t)
	head := strings.TrimSpace(git(t, root, "rev-parse", "HEAD"))
	var sums []string
	for _, name := range []string{"first", "second-checkout"} {
		// A clone, not a worktree: Go stamps the commit only where .git
		// is a directory.
		dir := filepath.Join(t.TempDir(), name)
		git(t, root, "clone", "--quiet", "--shared", "--no-checkout", root, dir)
		git(t, dir, "checkout", "--quiet", "--detach", head)
		out := filepath.Join(t.TempDir(), "dist")
		res, err := testbin.Run(ctx, "bash", os.Environ(), filepath.Join(dir, "release", "build.sh"),
			"--platforms", "linux/amd64", "--out", out, "v0.0.0-reproducible")
		if err != nil || res.Code != 0 {
			t.Fatalf("build.sh in %s: %v (exit %d)\n%s%s", dir, err, res.Code, res.Stdout, res.Stderr)
		}
		data, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, string(data))
		bin := filepath.Join(out, "relay_v0.0.0-reproducible_linux_amd64")
		info := goVersionM(t, bin)
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath=true", "vcs.revision=" + head, "vcs.modified=false"} {
			if !strings.Contains(info, want) {
				t.Errorf("%s: build info lacks %q:\n%s", bin, want, info)
			}
		}
		// The version given to build.sh is the one the binary reports.
		res, err = testbin.Run(ctx, bin, nil, "version")
		if err != nil || res.Code != 0 || !strings.HasPrefix(res.Stdout, "relay v0.0.0-reproducible\n") || !strings.Contains(res.Stdout, head[:12]) {
			t.Errorf("%s version: %v (exit %d)\n%s%s", bin, err, res.Code, res.Stdout, res.Stderr)
		}
	}
	if sums[0] != sums[1] {
		t.Fatalf("two builds of %s differ:\n%s\n%s", head, sums[0], sums[1])
	}
	if !strings.Contains(sums[0], "relay_v0.0.0-reproducible_linux_amd64") {
		t.Fatalf("SHA256SUMS does not name the binary:\n%s", sums[0])
	}
}

// TestBuildRefusesBadInput: a version that is not semantic, and a released
// version built from another commit, are refused with one line and a
// non-zero exit before anything is built.
func TestBuildRefusesBadInput(t *testing.T) {
	root := repoRoot(t)
	script := filepath.Join(root, "release", "build.sh")
	releases, err := testbin.Releases()
	if err != nil {
		t.Fatal(err)
	}
	head := strings.TrimSpace(git(t, root, "rev-parse", "HEAD"))
	cases := map[string][]string{
		"not semver":    {"--allow-dirty", "0.2"},
		"unknown flag":  {"--fast", "v0.2.0"},
		"missing value": {"--out"},
	}
	for _, rel := range releases {
		if rel.Commit != head {
			cases["released from another commit"] = []string{"--allow-dirty", "--out", t.TempDir(), rel.Version}
		}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			res, err := testbin.Run(context.Background(), "bash", os.Environ(), append([]string{script}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if res.Code == 0 || strings.Contains(res.Stdout, "building") || res.Stderr == "" {
				t.Fatalf("build.sh %v: exit %d\nstdout: %s\nstderr: %s", args, res.Code, res.Stdout, res.Stderr)
			}
		})
	}
}

func goVersionM(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m %s: %v\n%s", bin, err, out)
	}
	return string(out)
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(git(t, wd, "rev-parse", "--show-toplevel"))
}
