/* The guest-counts plugin's marker: one `xchg %bx,%bx` (66 87 db), which the plugin answers by
 * writing out its counters. */
int main(void)
{
    __asm__ volatile("xchg %%bx,%%bx" ::: "memory");
    return 0;
}
