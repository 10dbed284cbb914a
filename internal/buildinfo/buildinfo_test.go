package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfoReadsTheVCSStamp(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.time", Value: "2026-12-07T17:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	info := fromBuildInfo(bi, true)
	if info.Commit != "0123456789abcdef0123456789abcdef01234567" || info.CommitTime != "2026-12-07T17:00:00Z" || !info.Modified || info.GoVersion != "go1.99.1" {
		t.Fatalf("info = %+v", info)
	}
	want := Version + " (commit 0123456789ab-dirty, built 2026-12-07T17:00:00Z, go1.99.1, " + runtime.GOOS + "/" + runtime.GOARCH + ")"
	if got := info.String(); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if !strings.Contains(info.Lines(), "uncommitted changes") {
		t.Fatalf("Lines() does not mention the modified tree:\n%s", info.Lines())
	}
}

func TestFromBuildInfoWithoutStamp(t *testing.T) {
	info := fromBuildInfo(nil, false)
	if info.Commit != Unknown || info.CommitTime != Unknown || info.Modified || info.GoVersion != runtime.Version() {
		t.Fatalf("info = %+v", info)
	}
}
