//! tb-nodelet: the agent that runs on each Mac. It registers the Mac, reports its capacity and
//! Thunderbolt topology, and runs the work the controller assigns. (Built in a later step; this
//! binary only says so.)

fn main() {
    eprintln!("tb-nodelet: not built yet; this release ships the controller and tbctl");
    std::process::exit(2);
}
