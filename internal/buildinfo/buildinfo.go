// Package buildinfo says which relay this is: its release version, set at
// link time, and the commit, commit time, tree state and Go version the Go
// toolchain records in the binary.
//
// A release build sets the version with
//
//	go build -ldflags "-X github.com/outboxrelay/relay/internal/buildinfo.Version=vX.Y.Z" ./cmd/relay
//
// (the release script relies on exactly this variable). Without it the
// version is the one of the source tree. The commit and its time come from
// the VCS stamp of `go build` (runtime/debug.ReadBuildInfo); a binary built
// outside a git checkout, or with -buildvcs=false, reports them as unknown.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the relay's release version; the release build overrides it
// with -ldflags -X (see the package doc).
var Version = "v0.2.0"

// Unknown stands for a field the binary does not record.
const Unknown = "unknown"

// Info describes the running binary.
type Info struct {
	Version string `json:"version"`
	// Commit is the full VCS revision, Unknown when not recorded.
	Commit string `json:"commit"`
	// CommitTime is the commit's time (RFC 3339), Unknown when not
	// recorded: the build's date as far as the binary can tell.
	CommitTime string `json:"commit_time"`
	// Modified is true when the tree had uncommitted changes at build time.
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
}

// Get returns the running binary's Info.
func Get() Info {
	return fromBuildInfo(debug.ReadBuildInfo())
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool) Info {
	info := Info{Version: Version, Commit: Unknown, CommitTime: Unknown, GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH}
	if !ok {
		return info
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
		case "vcs.time":
			info.CommitTime = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// ShortCommit is the commit's first 12 hex digits, with "-dirty" when the
// tree was modified.
func (i Info) ShortCommit() string {
	c := i.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if i.Modified {
		c += "-dirty"
	}
	return c
}

// String is the one-line description: "v0.2.0 (commit 0123456789ab,
// built 2026-12-07T17:00:00Z, go1.26.0, linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, built %s, %s, %s/%s)", i.Version, i.ShortCommit(), i.CommitTime, i.GoVersion, i.OS, i.Arch)
}

// Lines is the multi-line description `relay version` prints after its
// first line.
func (i Info) Lines() string {
	var b strings.Builder
	fmt.Fprintf(&b, "commit:     %s\n", i.Commit)
	if i.Modified {
		b.WriteString("modified:   true (built from a tree with uncommitted changes)\n")
	}
	fmt.Fprintf(&b, "build date: %s\n", i.CommitTime)
	fmt.Fprintf(&b, "go:         %s\n", i.GoVersion)
	fmt.Fprintf(&b, "platform:   %s/%s\n", i.OS, i.Arch)
	return b.String()
}
