// Package procstat reads a Linux process's resource use from /proc: its
// peak resident set size, CPU time and open file descriptors, for the benchmark and for tests
// that hold the relay to a memory limit.
package procstat

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// PeakRSS returns the process's peak resident set size in bytes (VmHWM).
func PeakRSS(pid int) (int64, error) { return statusKB(pid, "VmHWM:") }

// statusKB reads a field of /proc/PID/status given in kB, in bytes.
func statusKB(pid int, field string) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == field {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s of process %d: %w", field, pid, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// CPUSeconds returns the process's user and system CPU time.
func CPUSeconds(pid int) (float64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) <= 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}

// RSS returns the process's current resident set size in bytes (VmRSS).
func RSS(pid int) (int64, error) { return statusKB(pid, "VmRSS:") }

// AnonRSS returns the anonymous part of the process's resident set in
// bytes (RssAnon): its heap and stacks, without the pages of mapped files
// such as its executable, which the kernel can drop and read again.
func AnonRSS(pid int) (int64, error) { return statusKB(pid, "RssAnon:") }

// OpenFiles counts the process's open file descriptors (/proc/PID/fd).
func OpenFiles(pid int) (int, error) {
	d, err := os.Open(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	defer d.Close()
	// Names only: ReadDir would also sort thousands of entries.
	names, err := d.Readdirnames(-1)
	return len(names), err
}
