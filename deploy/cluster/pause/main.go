// Command pause is the process of a pod's sandbox container: it holds the pod's namespaces,
// reaps the zombies it inherits as PID 1, and exits on SIGINT or SIGTERM. Built here because
// registry.k8s.io/pause cannot be pulled on a machine without an image registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
