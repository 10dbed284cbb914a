package cli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/internal/buildinfo"
)

func versionCommand(name string) *command {
	return &command{name: "version", summary: "print the version, commit, build date and Go version (also --version, -v)",
		run: func(ctx context.Context, stdio IO, args []string) error { return printVersion(name, stdio, args) }, readOnly: true}
}

// isVersionFlag reports whether arg asks the root command for the version.
func isVersionFlag(arg string) bool { return arg == "--version" || arg == "-version" || arg == "-v" }

func printVersion(name string, stdio IO, args []string) error {
	fs := flagSet(name+" version", stdio)
	asJSON := fs.Bool("json", false, "print as JSON")
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	info := buildinfo.Get()
	if *asJSON {
		enc := json.NewEncoder(stdio.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(info)
	}
	fmt.Fprintf(stdio.Stdout, "%s %s\n%s", name, info.Version, info.Lines())
	return nil
}

// buildInfoGauge is relay_build_info: 1, labelled with the binary's
// version, commit and Go version.
func buildInfoGauge() prometheus.Collector {
	info := buildinfo.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "relay_build_info",
		Help:        "Always 1; its labels name the running relay's version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": info.Version, "commit": info.ShortCommit(), "goversion": info.GoVersion},
	})
	g.Set(1)
	return g
}
