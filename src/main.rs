fn main() {
    std::process::exit(gitterm_agent::cli::main());
}
