// Command probe prints what package version reports, for the package's
// test of the link stamp.
package main

import (
	"fmt"

	"github.com/hadar-sched/hadar/version"
)

func main() {
	fmt.Println(version.String("probe"))
	fmt.Println(version.Plugin())
}
