package cli

import (
	"context"
	"flag"
	"io"
	"strings"
)

// CommandRef describes one command of a binary for the reference pages:
// its full name, summary and flags, as the binary parses them.
type CommandRef struct {
	// Path is the command as typed: "relay run", "relay-dev bench broker".
	Path    string
	Summary string
	Flags   []FlagRef
}

// FlagRef is one flag of a command.
type FlagRef struct {
	Name, Default, Usage string
}

// Env is the environment variable that also sets the flag.
func (f FlagRef) Env() string { return EnvName(f.Name) }

// Reference lists every command of the binary called name, with the
// relay's commands and extra, in the order `name -h` prints them. Each
// command is asked for its flags through the FlagSet it parses, with a
// cancelled context and without parsing anything, so nothing runs.
func Reference(name string, extra []Command) []CommandRef {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out []CommandRef
	var walk func(c *command, path []string)
	walk = func(c *command, path []string) {
		if c.run != nil {
			out = append(out, CommandRef{Path: strings.Join(path, " "), Summary: c.summary, Flags: flagsOf(ctx, c.run, nil)})
		}
		for _, sub := range c.sub {
			walk(sub, append(append([]string{}, path...), sub.name))
		}
	}
	root := commands(name, nil)
	walk(root, []string{name})
	for _, c := range extra {
		out = append(out, CommandRef{Path: name + " " + c.Name, Summary: c.Summary, Flags: flagsOf(ctx, c.Run, nil)})
		for _, sub := range c.Subcommands {
			out = append(out, CommandRef{Path: name + " " + c.Name + " " + sub.Name, Summary: sub.Summary,
				Flags: flagsOf(ctx, c.Run, []string{sub.Name})})
		}
	}
	return out
}

// flagsOf runs a command with args and a describing IO, and returns the
// flags of the FlagSet it would parse (none for a command without flags).
func flagsOf(ctx context.Context, run func(context.Context, IO, []string) error, args []string) []FlagRef {
	var flags []FlagRef
	described := false
	stdio := IO{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" },
		describe: func(fs *flag.FlagSet) {
			if described {
				return
			}
			described = true
			fs.VisitAll(func(f *flag.Flag) {
				flags = append(flags, FlagRef{Name: f.Name, Default: f.DefValue, Usage: f.Usage})
			})
		}}
	_ = run(ctx, stdio, append(args, "-h"))
	return flags
}
